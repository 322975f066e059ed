// Package transport puts a fleet's quota under an http.Client.
//
// New wraps an http.RoundTripper so that every request waits for its
// target's slot in a throttle.Throttler before it is sent, and so that
// what the target says back reaches the whole fleet:
//
//   - a 429 or 503 with a valid Retry-After pauses the target fleet-wide
//     for that long (throttle.Throttler.Pause), capped;
//   - a 429 without one pauses it for a time that doubles with each 429
//     in a row, from DefaultFirstPause, until a 2xx, each pause drawn
//     between half its nominal length and all of it (equal jitter, so
//     processes that hear the same 429s do not all come back at once;
//     WithPauseBackoff);
//   - RateLimit and X-RateLimit fields that say no requests remain pause
//     it until their reset.
//
// A request whose slot was in the future checks for such a pause when the
// slot comes, so slots booked before a 429 do not land inside the pause
// that followed it. When net/http hands the request a connection (through
// httptrace's GotConn, before a byte is written), a slot that went stale
// meanwhile (a slow dial or TLS handshake) is booked again, and a request
// net/http sends again on another connection pays the quota again. Signals
// only ever hold the fleet back. Malformed or
// absurd fields are ignored (logged at Debug) or capped, never trusted.
//
// # Retries
//
// By default a Transport makes up to DefaultAttempts attempts of an
// idempotent request with a replayable body while the outcome is
// retryable (see package backoff), waiting max(backoff delay,
// Retry-After) and then the quota again before each. Clients that retry
// themselves, such as go-retryablehttp, should use WithoutRetries; the
// quota and the pauses still apply to each of their attempts.
//
// OnAttempt reports every attempt (status, error, time waited, pause
// caused), and WithAttemptsHeader writes the number of attempts into the
// returned response.
//
// # The RoundTripper contract
//
// A Transport never modifies the caller's request: each attempt sends a
// clone, with a body from GetBody after the first. A request with a body
// but no GetBody is sent once. Every response that is not returned is
// drained (up to 64 KiB) and closed; a response is always returned with a
// nil error; and when a request fails before it is sent, its body is
// closed.
package transport
