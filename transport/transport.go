package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/backoff"
	"github.com/fleetgate/fleetgate/throttle"
)

const (
	// maxDrain bounds how much of a discarded response body is read so its
	// connection can be reused; past it the connection is closed instead.
	maxDrain = 64 << 10

	// drainTimeout bounds the drain of a discarded body: a target that
	// stalls a body it sent no more of must not hold a retry.
	drainTimeout = time.Second

	// slept is the wait past which a pause may have begun while this
	// request slept, so it is checked before sending.
	slept = time.Millisecond

	// pauseCheckLead is how long before its slot a sleeping request checks
	// for a fleet-wide pause. A pause that begins within it is missed: the
	// request counts as already in flight.
	pauseCheckLead = 10 * time.Millisecond
)

// Transport is an http.RoundTripper that sends every request only when the
// fleet's quota for its target allows it, shares the target's rate-limit
// signals (429, 503, Retry-After, RateLimit fields) with the whole fleet
// as pauses, and retries what is worth retrying.
//
// Create it with New; the zero Transport is not usable. A Transport is
// safe for concurrent use, and keeps the http.RoundTripper contract: it
// never modifies the caller's request, closes the request body on every
// path, closes every response it does not return, and returns a nil
// error whenever it returns a response.
type Transport struct {
	base    http.RoundTripper
	t       *throttle.Throttler
	cfg     config
	streaks streaks
}

// New returns a Transport that sends requests through base (nil means
// http.DefaultTransport) under the quota of t, which it does not own: the
// caller closes t after the Transport's last use.
//
// Requests count against the target t makes of req.URL.Host (normalised
// and grouped by t's KeyMode); each hop of a redirect waits on its own
// host's quota. With no options, a retryable request is sent up to
// DefaultAttempts times, every wait a response asks for is capped at
// DefaultMaxRetryAfter, nothing is added to responses, and ignored headers
// are logged to slog.Default() at Debug. New panics if t is nil, a
// programming error.
func New(base http.RoundTripper, t *throttle.Throttler, opts ...Option) *Transport {
	if t == nil {
		panic("transport: New with a nil *throttle.Throttler")
	}
	if base == nil {
		base = http.DefaultTransport
	}
	c := config{attempts: DefaultAttempts, maxRetryAfter: DefaultMaxRetryAfter, now: time.Now}
	for _, o := range opts {
		o(&c)
	}
	if c.maxRetryAfter <= 0 {
		c.maxRetryAfter = DefaultMaxRetryAfter
	}
	if c.policy == nil {
		c.policy = new(backoff.Exponential)
	}
	if c.pausePolicy == nil {
		c.pausePolicy = &backoff.Exponential{Base: DefaultFirstPause, Multiplier: 2, Max: c.maxRetryAfter, Jitter: backoff.EqualJitter}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return &Transport{base: base, t: t, cfg: c}
}

// RoundTrip sends req when the quota of its target allows, and returns the
// response of the last attempt, or an *Error when that attempt has none.
//
// Each attempt waits on the quota with req's context; if its slot was in
// the future it checks, just before the slot, that no fleet-wide pause
// began meanwhile, and if one did it sits the pause out and waits again.
// Under the limit an attempt costs one store call.
//
// Every response is read for signals, whatever its status: a valid
// Retry-After on a 429 or 503 pauses the whole fleet for that long (the
// longest of several field lines; see backoff.ParseRetryAfterField); a 429
// without one pauses it for a time that grows with each 429 in a row (see
// WithPauseBackoff); RateLimit or X-RateLimit fields saying no requests
// remain pause it until their reset. Every such wait is capped (see
// WithMaxRetryAfter). These signals only ever hold the fleet back; they
// never raise a rule. Unusable fields are ignored.
//
// A request is retried only if it is idempotent (backoff.Idempotent) and
// its body can be replayed (no body, or GetBody set), only while the
// outcome is retryable (backoff.Retryable: 429, 502, 503, 504, or a
// transient network error) and attempts remain. Before the next attempt
// it waits max(backoff delay, Retry-After), then the quota. If ctx's
// deadline would pass before the next attempt could be sent (during that
// delay, the pause the response asked for, or because the quota has no
// slot before it), the current outcome is returned instead: a response
// whose body is at most 64 KiB is kept in memory for that while, a longer
// one is drained (at most 64 KiB) and closed like every discarded response,
// and then the quota's error is returned. So is the current outcome when
// GetBody fails for the next attempt, which is then not sent.
//
// The slot is checked again when net/http hands the attempt a connection,
// before a byte is written: one that went stale meanwhile (a slow dial or
// TLS handshake, a wait for a free connection, an HTTP/2 retry's back-off)
// is booked again, and a request net/http sends again on another HTTP/1
// connection, after a reused one failed before the response (the target
// may have received the first), waits on the quota for a slot of its own.
// A request that finds no slot there is not sent, and RoundTrip returns an
// *Error wrapping the quota's error; under WithAttemptTimeout, the wait
// there is bounded by the attempt's bound, and one that would pass it
// ends the attempt as timed out, retried as one. A returned response's body ends the
// attempt's context when it is closed, as every response body must be.
//
// When it fails before an attempt is sent (the quota wait fails: a bad
// target, ctx ended, or a slot past ctx's deadline), RoundTrip returns an
// *Error wrapping the cause; req's body is closed, and a slot booked for
// the attempt is released.
//
// When it fails because ctx ended (in the quota wait, in the delay before
// a retry, or while an attempt was in flight and the base reported ctx's
// end, as net/http does), its *Error matches ctx.Err() (context.Canceled
// or context.DeadlineExceeded) and, when ctx was given a cause
// (context.WithCancelCause, context.WithDeadlineCause), that cause too;
// the base's own error stays in the chain.
func (tr *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		closeBody(req)
		return nil, &Error{Attempt: 1, Err: errNilURL}
	}
	ctx, host := req.Context(), req.URL.Host
	attempts := tr.cfg.attempts
	hasBody := req.Body != nil && req.Body != http.NoBody
	if attempts > 1 && (!backoff.Idempotent(req) || hasBody && req.GetBody == nil) {
		attempts = 1
	}
	var (
		attempt     int
		delay, prev time.Duration // before the next attempt; the last policy delay
		resp        *http.Response
		err         error
	)
	for attempt = 1; ; attempt++ {
		start := tr.cfg.now()
		actx, guard := tr.guard(ctx, host)
		out, res, werr := tr.prepare(ctx, actx, req, host, attempt, delay)
		info := AttemptInfo{Request: req, Attempt: attempt, Waited: tr.cfg.now().Sub(start)}
		if werr != nil {
			guard.done(nil)
			if attempt == 1 {
				closeBody(req)
			}
			info.Err = werr
			tr.report(info)
			if attempt > 1 && (errors.Is(werr, context.DeadlineExceeded) || errors.Is(werr, errReplay)) && (resp != nil || err != nil) {
				// The quota had no slot before the deadline, or the body
				// cannot be sent again: the previous outcome is the answer.
				attempt--
				break
			}
			return nil, &Error{Host: host, Attempt: attempt, Err: werr, quota: true, user: req.URL.User}
		}

		guard.res = res
		sent := tr.cfg.now()
		resp, err = tr.send(guard, out)
		switch {
		case err != nil && resp != nil: // a base that breaks the contract
			discard(resp)
			resp = nil
		case err == nil && resp == nil:
			err = errNoResponse
		case err != nil:
			err = endedWith(ctx, err)
		}
		waited, ranOut, gerr := guard.stopped()
		info.Waited += waited
		var sg signals
		if gerr != nil { // no slot at the connection: not sent
			if resp != nil {
				discard(resp)
			}
			guard.done(nil)
			info.Err = gerr
			tr.report(info)
			if !ranOut {
				return nil, &Error{Host: host, Attempt: attempt, Err: gerr, quota: true, user: req.URL.User}
			}
			// The attempt's own bound ran out at its connection: an
			// attempt that timed out, retried as one.
			resp, err = nil, gerr
		} else {
			resp = guard.done(resp)
			if resp != nil {
				// A 429 to a request that waited out a pause at its
				// connection is news: it was sent after the pause.
				sg = tr.observe(ctx, host, resp, guard.sentAt(sent))
				info.Status = resp.StatusCode
			}
			info.Err, info.Pause = err, sg.pause
			tr.report(info)
		}

		if attempt >= attempts || !backoff.Retryable(ctx, resp, err) {
			break
		}
		d := tr.cfg.policy.Delay(attempt-1, prev)
		prev = d
		delay = max(d, sg.retryAfter)
		if dl, ok := ctx.Deadline(); ok && tr.cfg.now().Add(max(delay, sg.pause)).After(dl) {
			break // the next attempt could not be sent in time
		}
		if resp != nil {
			resp = keep(resp) // the answer still, if the next attempt finds no slot in time
		}
		if info.Err != nil {
			tr.log(ctx, slog.LevelDebug, "fleetgate: retrying", host,
				"attempt", attempt+1, "delay", delay, "error", hiddenPassword{info.Err, req.URL.User})
		} else {
			tr.log(ctx, slog.LevelDebug, "fleetgate: retrying", host,
				"attempt", attempt+1, "delay", delay, "status", info.Status)
		}
	}
	if err != nil {
		return nil, &Error{Host: host, Attempt: attempt, Err: err, user: req.URL.User}
	}
	if tr.cfg.attemptsHeader != "" {
		if resp.Header == nil {
			resp.Header = make(http.Header)
		}
		resp.Header[tr.cfg.attemptsHeader] = []string{strconv.Itoa(attempt)}
	}
	return resp, nil
}

// send hands one attempt to the base, bounded by WithAttemptTimeout when
// it is set: g.done releases the deadline with the attempt, when the
// response's body is closed or at once without one.
func (tr *Transport) send(g *connGuard, req *http.Request) (*http.Response, error) {
	d := tr.cfg.attemptTimeout
	if d <= 0 {
		return tr.base.RoundTrip(req)
	}
	ctx, stop := context.WithTimeout(req.Context(), d)
	g.stop = stop
	dl, _ := ctx.Deadline()
	cdl, ok := g.ctx.Deadline()
	g.bound, g.byAttempt = ctx, !ok || dl.Before(cdl)
	return tr.base.RoundTrip(req.WithContext(ctx))
}

// prepare waits delay, then on the quota, and returns the request to send
// for this attempt (a clone of req with the attempt's context actx, and a
// fresh body after the first) and the reservation it waited for. On error
// nothing is left open and no slot is kept.
func (tr *Transport) prepare(ctx, actx context.Context, req *http.Request, host string, attempt int, delay time.Duration) (*http.Request, *throttle.Reservation, error) {
	out := req.Clone(actx)
	if attempt > 1 && out.Body != nil && out.Body != http.NoBody {
		// Before the delay: a body that cannot be replayed ends the
		// retries at once.
		body, err := req.GetBody()
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", errReplay, err)
		}
		out.Body = body
	}
	if delay > 0 {
		if err := sleep(ctx, delay); err != nil {
			if attempt > 1 {
				closeBody(out)
			}
			return nil, nil, fmt.Errorf("delay before retry: %w", err)
		}
	}
	r, err := tr.wait(ctx, host)
	if err != nil {
		if attempt > 1 {
			closeBody(out)
		}
		return nil, nil, err
	}
	return out, r, nil
}

// wait books a slot for one request to host, sleeps until it and returns
// its reservation. If the slot was in the future, it checks,
// pauseCheckLead before the slot, that no fleet-wide pause began
// meanwhile, so the check's round trip hides in the sleep instead of
// delaying the request; if one did, it gives the slot back and books again
// (the store puts the new slot after the pause). On error no slot is kept.
func (tr *Transport) wait(ctx context.Context, host string) (*throttle.Reservation, error) {
	for {
		r, err := tr.t.ReserveN(ctx, host, 1)
		if err != nil {
			return nil, err
		}
		left := time.Duration(0)
		if d := r.Delay(); d > slept {
			if err := sleepFor(ctx, r, d-pauseCheckLead); err != nil {
				return nil, err
			}
			left, _ = r.Paused(ctx) // on a store error, the local copy answers
		}
		if left <= 0 {
			if err := sleepFor(ctx, r, r.Delay()); err != nil {
				return nil, err
			}
			if !r.Stale() {
				return r, nil
			}
			_ = r.Cancel(context.WithoutCancel(ctx)) // woke long past the slot: book again
			continue
		}
		// Give the slot back and sit the pause out before booking again
		// (a pause known only locally would otherwise hand out the same
		// early slot again and again).
		_ = r.Cancel(context.WithoutCancel(ctx))
		for left > 0 {
			// Asking again every PauseRecheck writes the pause back if
			// Redis loses it meanwhile, before other processes send.
			if err := sleep(ctx, min(left, throttle.PauseRecheck)); err != nil {
				return nil, fmt.Errorf("wait for %q: %w", r.Target(), err)
			}
			if left -= throttle.PauseRecheck; left > 0 {
				if now, err := tr.t.Paused(ctx, host); err == nil {
					left = now
				}
			}
		}
	}
}

// sleepFor sleeps d (nothing when d <= 0) for reservation r, releasing r if
// ctx ends first.
func sleepFor(ctx context.Context, r *throttle.Reservation, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if err := sleep(ctx, d); err != nil {
		_ = r.Cancel(context.WithoutCancel(ctx)) // an orphan slot only makes the log stricter
		return fmt.Errorf("wait for %q: %w", r.Target(), err)
	}
	return nil
}

func (tr *Transport) report(info AttemptInfo) {
	if tr.cfg.onAttempt != nil {
		tr.cfg.onAttempt(info)
	}
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has such a method. http.Client.CloseIdleConnections
// calls it.
func (tr *Transport) CloseIdleConnections() {
	if c, ok := tr.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// sleep waits d or until ctx ends, returning ctx's cause.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctxErr(ctx)
	}
}

// ctxErr returns why ctx ended: its Err, which callers match
// (context.Canceled, context.DeadlineExceeded), and its cause too when it
// was given one.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// endedWith returns err, an attempt's failure, so that it also matches
// ctx.Err() (context.Canceled, context.DeadlineExceeded) when ctx ended
// with a cause and err reports only that cause, as net/http does: "CTXERR:
// ERR", err still in the chain. Any other err is returned as it is.
func endedWith(ctx context.Context, err error) error {
	cerr := ctx.Err()
	if cerr == nil || errors.Is(err, cerr) {
		return err
	}
	if cause := context.Cause(ctx); cause == cerr || !errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w: %w", cerr, err)
}

// keep reads resp's body into memory, when it is at most maxDrain, and
// returns resp with that copy as its body, its connection free for reuse;
// a longer body is discarded, and keep returns nil.
func keep(resp *http.Response) *http.Response {
	if resp.Body == nil {
		return resp
	}
	stop := time.AfterFunc(drainTimeout, func() { _ = resp.Body.Close() })
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDrain+1))
	stop.Stop()
	_ = resp.Body.Close()
	if err != nil || len(body) > maxDrain {
		return nil
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	return resp
}

// discard drains a little of resp's body, so its connection can be
// reused, and closes it. A body that stalls is closed after drainTimeout.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	stop := time.AfterFunc(drainTimeout, func() { _ = resp.Body.Close() })
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	stop.Stop()
	_ = resp.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// hiddenPassword is an attempt's error in a log line: its text as
// hidePassword gives it, made only when the line is written.
type hiddenPassword struct {
	err  error
	user *url.Userinfo
}

// LogValue implements slog.LogValuer.
func (h hiddenPassword) LogValue() slog.Value {
	return slog.StringValue(hidePassword(h.err.Error(), h.user))
}

// hidePassword returns msg, an attempt's error, with user's password, if
// any, shown as "xxxxx", as it is and as a URL escapes it, or the user
// before its '@' when it has no password or an empty one (a token, most
// often): a
// base that quotes the request's URL in its errors must not put either in
// a log line, nor in the text of the Error RoundTrip returns.
func hidePassword(msg string, user *url.Userinfo) string {
	if user == nil {
		return msg
	}
	pw, ok := user.Password()
	if !ok || pw == "" { // a token, most often, as "TOKEN@" or "TOKEN:@"
		name := user.Username()
		if name == "" {
			return msg
		}
		for _, form := range []string{user.String(), name + ":", name} {
			msg = strings.ReplaceAll(msg, form+"@", "xxxxx@")
		}
		return msg
	}
	escaped := strings.TrimPrefix(url.UserPassword("", pw).String(), ":")
	return strings.ReplaceAll(strings.ReplaceAll(msg, escaped, "xxxxx"), pw, "xxxxx")
}
