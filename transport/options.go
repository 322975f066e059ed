package transport

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/fleetgate/fleetgate/backoff"
)

// Defaults of New.
const (
	// DefaultAttempts is how many times, in total, a Transport sends a
	// retryable request before it returns the last outcome.
	DefaultAttempts = 4

	// DefaultMaxRetryAfter caps every wait a response asks for: a
	// Retry-After field, a rate-limit reset, and the pauses after a 429
	// without Retry-After.
	DefaultMaxRetryAfter = backoff.DefaultMaxRetryAfter

	// DefaultFirstPause is the first fleet-wide pause after a 429 that
	// carries no valid Retry-After; each further 429 in a row doubles it.
	DefaultFirstPause = time.Second
)

// An Option configures New.
type Option func(*config)

type config struct {
	attempts       int
	policy         *backoff.Exponential // between attempts
	pausePolicy    *backoff.Exponential // 429 without Retry-After; nil until New
	maxRetryAfter  time.Duration
	attemptsHeader string
	attemptTimeout time.Duration // 0: none
	onAttempt      func(AttemptInfo)
	logger         *slog.Logger
	now            func() time.Time // the local clock; tests replace it
}

// WithRetries sets the maximum number of attempts per request, the first
// included (default DefaultAttempts). 1, or any smaller value, turns
// retries off, as WithoutRetries does.
func WithRetries(attempts int) Option {
	return func(c *config) { c.attempts = max(attempts, 1) }
}

// WithoutRetries sends every request once: the Transport still waits on
// the quota and still reads every response's rate-limit signals. Use it
// under a client that retries itself, such as go-retryablehttp.
func WithoutRetries() Option { return WithRetries(1) }

// WithBackoff sets the delay policy between attempts (default: the zero
// backoff.Exponential, 100ms doubling to 30s with full jitter). Before
// retry number n (0 for the second attempt) the Transport waits
// max(p.Delay(n, prev), Retry-After), then waits on the quota. A nil p
// means the default. p must not be changed while the Transport is in use.
func WithBackoff(p *backoff.Exponential) Option {
	return func(c *config) { c.policy = p }
}

// WithPauseBackoff sets the fleet-wide pauses after 429 responses that
// carry no valid Retry-After: the n-th such 429 in a row for a target
// (from 0) pauses it for p.Delay(n, prev), capped at the Retry-After cap.
// A 2xx from the target ends the run, and so does a time as long as the
// Retry-After cap (WithMaxRetryAfter) with no such 429 after the latest
// pause ended: a target met again much later starts afresh, and runs of
// targets not met again are not kept. The default is DefaultFirstPause
// doubling per 429, with equal jitter (each pause is at least half its
// nominal length), capped at the Retry-After cap. A nil p means the
// default.
func WithPauseBackoff(p *backoff.Exponential) Option {
	return func(c *config) { c.pausePolicy = p }
}

// WithMaxRetryAfter caps every wait a response asks for, whether by
// Retry-After, by a rate-limit reset or by a run of 429s (default
// DefaultMaxRetryAfter; d <= 0 means the default). The Throttler caps
// its pauses again at its own maximum (throttle.WithMaxPause).
func WithMaxRetryAfter(d time.Duration) Option {
	return func(c *config) { c.maxRetryAfter = d }
}

// WithAttemptTimeout bounds each attempt by d, from when it is handed to
// the base RoundTripper (its slot reached) until its response's body is
// closed: the connection, the request, the headers and the whole body. The
// wait on the quota and the delay before a retry do not count, which an
// http.Client's Timeout, spanning every attempt and every wait, cannot
// leave out; a second wait on the quota inside the attempt (its connection
// came too late for its slot, see RoundTrip) does. An attempt that runs
// out fails with an error that matches context.DeadlineExceeded and is
// retried as a timeout; a body read past it fails with that error too. A
// 101 response's connection is bounded likewise, so leave it unset for
// upgrades meant to last. d <= 0 (the default) sets no bound.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *config) { c.attemptTimeout = max(d, 0) }
}

// WithAttemptsHeader makes the Transport set the header name on every
// response it returns to the number of attempts made, "1" when the first
// one succeeded; for example "X-Fleetgate-Attempts". The header is added
// by the Transport, not sent by the server. An empty name (the default)
// adds nothing.
func WithAttemptsHeader(name string) Option {
	return func(c *config) { c.attemptsHeader = http.CanonicalHeaderKey(name) }
}

// OnAttempt makes the Transport call fn once after every attempt, in the
// goroutine of RoundTrip, before it decides whether to retry: to count
// attempts, 429s or fleet-wide pauses, for example. fn is called
// concurrently when the Transport is, so it must be safe for concurrent
// use, and it must not block: the request waits for it.
func OnAttempt(fn func(AttemptInfo)) Option {
	return func(c *config) { c.onAttempt = fn }
}

// WithLogger sets where the Transport logs ignored headers and each retry,
// just before its delay, as "fleetgate: retrying" (at Debug), and a
// Retry-After cut to the cap and pauses it could not share with the fleet
// (at Warn). A pause of the fleet is logged by the Throttler, with its own
// logger (throttle.WithLogger), once per pause. The default is
// slog.Default(). A retry's line, like the text of the Error RoundTrip
// returns, shows the request URL's password as "xxxxx", and its user too
// when it has no password (a token, most often), where the base's error
// quotes them.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// AttemptInfo describes one attempt of a request, for OnAttempt.
type AttemptInfo struct {
	// Request is the caller's request. It must not be modified.
	Request *http.Request
	// Attempt is the attempt's number, from 1.
	Attempt int
	// Status is the response's status code; 0 when there is no response.
	Status int
	// Err is why the attempt failed without a response: the wait on the
	// quota, replaying the body, or the base RoundTripper; nil otherwise.
	Err error
	// Waited is how long the attempt waited before it was sent (or until
	// it failed): the delay after the previous attempt, then the quota,
	// including any fleet-wide pause it sat out, and the quota again when
	// its connection came too late for its slot or net/http sent it again.
	Waited time.Duration
	// Pause is the fleet-wide pause the response asked the Throttler for,
	// after the Retry-After cap (the Throttler may cap it further); 0 when
	// the response asked for none.
	Pause time.Duration
}
