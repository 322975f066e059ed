package transport

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/fleetgate/fleetgate/backoff"
)

// Error is the error RoundTrip returns when it has no response to return.
// It names the host and the attempt that failed, and wraps the cause, so
// errors.Is matches context.Canceled, context.DeadlineExceeded,
// throttle.ErrBadTarget and the like, and errors.As finds the Error itself
// under the *url.Error of an http.Client.
type Error struct {
	Host    string // the request's URL.Host, as given
	Attempt int    // the attempt that failed, from 1 (one whose quota wait failed was not sent)
	Err     error  // the cause; never nil

	quota bool          // the quota had no slot for the attempt in time (or a bad target): not sent
	user  *url.Userinfo // the request URL's (immutable): hidden in the text
}

// Error returns "transport: attempt N to "HOST": CAUSE", where the request
// URL's password, or its user when it has none (a token, most often), is
// shown as "xxxxx" if the cause quotes it, as a base RoundTripper's error
// may. Err itself is left as it is, and so is the *url.Error an
// http.Client wraps around the Error, which shows the URL as net/http
// redacts it: a password hidden, a user without one shown.
func (e *Error) Error() string {
	return fmt.Sprintf("transport: attempt %d to %q: %s", e.Attempt, e.Host, hidePassword(e.Err.Error(), e.user))
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Timeout reports whether the attempt timed out: its cause is a timeout
// (backoff.Timeout: a network timeout, or its WithAttemptTimeout bound,
// even when that ran out while the attempt waited on the quota at its
// connection). An attempt the quota had no slot for before the caller's
// deadline did not time out: a retry within that deadline would find no
// slot either. So an http.Client's *url.Error reports Timeout as this
// does, and backoff.Retryable retries a timed-out attempt.
func (e *Error) Timeout() bool { return !e.quota && backoff.Timeout(e.Err) }

var (
	errNilURL     = errors.New("nil Request.URL")
	errNoResponse = errors.New("base RoundTripper returned neither a response nor an error")
	errReplay     = errors.New("replay body") // GetBody failed: no retry can be sent
)
