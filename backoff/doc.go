// Package backoff decides when a fleetgate crawler may try a request again.
//
// It has four parts, one per file:
//
//   - [Exponential] computes jittered exponential delays between retries.
//   - [ParseRetryAfter] strictly parses an HTTP Retry-After field, and
//     [ParseRateLimit] reads the IETF RateLimit and the common
//     X-RateLimit-* fields into a [Hint]. Both cap every wait they return
//     and reject or ignore what they cannot read; neither guesses.
//     [ResponseDate] gives the server's clock to read their dates against.
//   - [Idempotent] and [Retryable] are the retry rules: which requests may
//     be repeated, and which outcomes are worth repeating; [Timeout] is
//     how Retryable tells a timeout, wrapped however deep.
//   - [RetryableHTTPBackoff] and [CheckRetry] plug those rules into
//     github.com/hashicorp/go-retryablehttp.
//
// Every function and method in the package is safe for concurrent use.
package backoff
