package backoff

import (
	"context"
	"net/http"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// RetryableHTTPBackoff returns a retryablehttp.Backoff that waits as a 429
// or 503 response's Retry-After field asks, read by [ParseRetryAfter]
// against the server's clock ([ResponseDate]) and capped at maxWait (maxWait <= 0 means
// [DefaultMaxRetryAfter]). Without a valid Retry-After it waits
// p.Delay(attemptNum, prev), where prev, which only DecorrelatedJitter
// uses, is the unjittered delay of the previous attempt, since
// retryablehttp keeps no history. A nil p means the zero [Exponential].
//
// The client's RetryWaitMin and RetryWaitMax are ignored: configure p
// instead. The returned function is safe for concurrent use.
func RetryableHTTPBackoff(p *Exponential, maxWait time.Duration) retryablehttp.Backoff {
	if p == nil {
		p = new(Exponential)
	}
	return func(_, _ time.Duration, attemptNum int, resp *http.Response) time.Duration {
		if resp != nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
			if d, err := ParseRetryAfterField(resp.Header.Values("Retry-After"), ResponseDate(resp.Header, time.Now()), maxWait); err == nil {
				return d
			}
		}
		var prev time.Duration
		if attemptNum > 0 {
			prev = p.ceiling(attemptNum - 1)
		}
		return p.Delay(attemptNum, prev)
	}
}

// CheckRetry is a retryablehttp.CheckRetry with the rules of
// [Retryable]. When ctx is done it returns false and ctx.Err(); otherwise
// its error is always nil, so retryablehttp returns a final response to
// the caller as it is.
//
// retryablehttp does not show CheckRetry the request, so the method is
// only checked through resp.Request when a response arrived. After a
// transport error nothing is known about the request: send only
// [Idempotent] requests through a client that uses CheckRetry.
func CheckRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	return Retryable(ctx, resp, err), nil
}
