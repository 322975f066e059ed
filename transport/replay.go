package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/throttle"
)

// connGuard keeps an attempt within the quota up to the moment the base
// RoundTripper writes it, through httptrace's GotConn, which net/http calls
// each time it has a connection for the request, before a byte is written:
//
//   - The first connection may come long after the slot: a dial, a TLS
//     handshake, or a wait for a free connection happens after the quota
//     wait. If the slot is stale by then (throttle.Reservation.Stale: later
//     than the margin allows), it is given back and the attempt books and
//     waits again before it is written.
//   - net/http sends an idempotent request again, on another connection,
//     when a reused HTTP/1 connection fails before the response's first
//     byte (a reset, say), and the target may well have received the
//     first: every HTTP/1 connection after the first waits on the quota
//     too. HTTP/2 retries a stream only when the server cannot have
//     processed it (a GOAWAY past it, a refused stream), so the slot is
//     still the attempt's; but it backs off first (a second, from its
//     second retry), so the slot is checked for staleness again.
//
// When no slot can be had (ctx ended, or the slot lies past its deadline),
// the request is stopped before it is written: the attempt's context is
// cancelled and, on a connection that carries HTTP/1, its writes fail at
// once, so the base gives up. An HTTP/2 connection (over TLS, or h2c
// through an http.Transport whose Protocols ask for it) carries other
// streams and is left alone: the cancelled context alone stops the
// request, which net/http checks before it writes a stream's headers. A
// base other than net/http's makes no GotConn calls; the guard then does
// nothing.
type connGuard struct {
	tr     *Transport
	ctx    context.Context // the caller's: the quota's waits are bounded by it
	host   string
	cancel context.CancelCauseFunc // ends the attempt's context
	trace  httptrace.ClientTrace
	body   attemptBody
	res    *throttle.Reservation // the attempt's slot, set before the base runs
	stop   context.CancelFunc    // releases WithAttemptTimeout's deadline, if the attempt has one
	// bound is the attempt's context under WithAttemptTimeout (nil
	// without): the quota's waits at its connections count against the
	// attempt's bound. byAttempt: its deadline is the attempt's own, before
	// the caller's.
	bound     context.Context
	byAttempt bool

	mu     sync.Mutex    // a base may trace from another goroutine
	conns  int           // connections the base got for the attempt
	waited time.Duration // on the quota, at those connections
	err    error         // why the request was stopped
	ranOut bool          // err is the attempt's own deadline, not the caller's
	rewait time.Time     // when the latest wait at a connection ended with a slot
}

// guard returns the context for an attempt at host, and its connGuard.
func (tr *Transport) guard(ctx context.Context, host string) (context.Context, *connGuard) {
	g := &connGuard{tr: tr, ctx: ctx, host: host}
	actx, cancel := context.WithCancelCause(ctx)
	g.cancel = cancel
	g.trace.GotConn = g.gotConn
	return httptrace.WithClientTrace(actx, &g.trace), g
}

// gotConn runs, on the attempt's goroutine, each time the base has a
// connection for the request and before it writes on it.
func (g *connGuard) gotConn(info httptrace.GotConnInfo) {
	g.mu.Lock()
	g.conns++
	first, stopped, res := g.conns == 1, g.err != nil, g.res
	g.mu.Unlock()
	var why string
	switch {
	case stopped:
	case !first && !g.multiplexed(info):
		why = "replay on another connection"
	case res != nil && res.Stale():
		_ = res.Cancel(context.WithoutCancel(g.ctx)) // an orphan slot only makes the log stricter
		why = "book again, the connection came too late for the slot"
	default:
		return // in time: the attempt, or an HTTP/2 retry of a stream the server refused
	}
	if !stopped {
		start := g.tr.cfg.now()
		wctx := g.ctx
		if g.bound != nil {
			wctx = g.bound
		}
		r, err := g.tr.wait(wctx, g.host)
		ranOut := false
		if err != nil {
			ranOut = g.byAttempt && g.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)
			err = fmt.Errorf("%s: %w", why, err)
			g.cancel(err)
		}
		end := g.tr.cfg.now()
		g.mu.Lock()
		g.waited += end.Sub(start)
		g.res, g.err, g.ranOut = r, err, ranOut
		if err == nil {
			g.rewait = end
		}
		g.mu.Unlock()
		if err == nil {
			return
		}
	}
	if info.Conn != nil && !g.multiplexed(info) {
		// net/http's HTTP/1 checks the context before it gets a
		// connection, not after: a write deadline in the past fails the
		// write before a byte leaves. The connection is this request's
		// alone.
		_ = info.Conn.SetWriteDeadline(time.Unix(1, 0))
	}
}

// multiplexed reports whether the connection may carry HTTP/2 (asked only
// past the first connection, or for a request being stopped: a TLS
// connection's state is copied to tell): negotiated
// over TLS, or unencrypted HTTP/2 with prior knowledge, which an
// http.Transport base uses when its Protocols allow it and not HTTP/1. An
// http.Transport speaks HTTP/2 over TLS only on a *tls.Conn, so a
// connection of another type (a dialer's wrapper) carries HTTP/1. A base
// of another kind that speaks h2c (golang.org/x/net/http2 with AllowHTTP)
// is not told apart: its connection is taken for HTTP/1.
func (g *connGuard) multiplexed(info httptrace.GotConnInfo) bool {
	switch c := info.Conn.(type) {
	case *tls.Conn:
		return c.ConnectionState().NegotiatedProtocol == "h2"
	case nil:
		return false
	}
	b, ok := g.tr.base.(*http.Transport)
	return ok && b.Protocols != nil && b.Protocols.UnencryptedHTTP2() && !b.Protocols.HTTP1()
}

// stopped returns how long the attempt waited on the quota at its
// connections, whether the attempt's own deadline (WithAttemptTimeout)
// stopped it while the caller's context was live, and why it was stopped
// before it was written, or nil.
func (g *connGuard) stopped() (waited time.Duration, ranOut bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waited, g.ranOut, g.err
}

// sentAt returns when the attempt was sent, given that it was handed to
// the base at handed: after the latest wait on the quota at a connection,
// if it waited there.
func (g *connGuard) sentAt(handed time.Time) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rewait.After(handed) {
		return g.rewait
	}
	return handed
}

// done ends the attempt's context once the attempt is over: when resp's
// body is closed, or at once when there is no response or no body to read
// (http.NoBody stays as it is, for callers that compare with it). It
// returns resp, its body wrapped to that end.
func (g *connGuard) done(resp *http.Response) *http.Response {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		g.cancel(nil)
		if g.stop != nil {
			g.stop()
		}
		return resp
	}
	b := &g.body
	b.ReadCloser, b.cancel, b.stop = resp.Body, g.cancel, g.stop
	if w, ok := resp.Body.(io.Writer); ok { // a 101 Switching Protocols body
		resp.Body = &attemptRWBody{attemptBody: b, Writer: w}
	} else {
		resp.Body = b
	}
	return resp
}

// attemptBody is a response body that ends its attempt's context, and
// its deadline if it has one, when it is closed.
type attemptBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
	stop   context.CancelFunc // nil: no deadline
}

func (b *attemptBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	if b.stop != nil {
		b.stop()
	}
	return err
}

// attemptRWBody is an attemptBody that keeps its body's Write.
type attemptRWBody struct {
	*attemptBody
	io.Writer
}
