package transport

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"
)

// replayGuard makes the base RoundTripper's own replays pay the quota.
//
// net/http sends an idempotent request again, on another connection, when
// a reused HTTP/1 connection fails before the response's first byte (a
// reset, say): the target may well have received the first. Each attempt
// carries a guard in its context, and every connection the base gets for
// the attempt after its first (httptrace's GotConn, which comes before the
// request is written) waits on the quota first. When no slot can be had
// (ctx ended, or the slot lies past its deadline), the replay is stopped
// before it is written: the attempt's context is cancelled and the
// connection's writes fail at once, so the base gives up.
//
// Replays over HTTP/2 are left alone: net/http retries a stream there only
// when the server cannot have processed it (a GOAWAY past it, a refused
// stream). A base other than net/http's makes no GotConn calls, and the
// guard does nothing.
type replayGuard struct {
	tr     *Transport
	ctx    context.Context // the caller's: the quota's waits are bounded by it
	host   string
	cancel context.CancelCauseFunc // ends the attempt's context
	trace  httptrace.ClientTrace
	body   attemptBody

	mu    sync.Mutex // a base may trace from another goroutine
	conns int        // connections the base got for the attempt
	err   error      // why a replay was stopped
}

// guard returns the context for an attempt at req: ctx with a replayGuard
// when net/http might replay req, else ctx itself and a nil guard.
func (tr *Transport) guard(ctx context.Context, req *http.Request, host string) (context.Context, *replayGuard) {
	if !replayable(req) {
		return ctx, nil
	}
	g := &replayGuard{tr: tr, ctx: ctx, host: host}
	actx, cancel := context.WithCancelCause(ctx)
	g.cancel = cancel
	g.trace.GotConn = g.gotConn
	return httptrace.WithClientTrace(actx, &g.trace), g
}

// replayable reports whether net/http may send req twice: its
// Request.isReplayable (an idempotent method, or an Idempotency-Key, and a
// body it can replay).
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// gotConn runs, on the attempt's goroutine, each time the base has a
// connection for the request and before it writes on it.
func (g *replayGuard) gotConn(info httptrace.GotConnInfo) {
	g.mu.Lock()
	g.conns++
	first, stopped := g.conns == 1, g.err != nil
	g.mu.Unlock()
	if first || overHTTP2(info) {
		return // the attempt itself, whose slot it waited for
	}
	if !stopped {
		if err := g.tr.wait(g.ctx, g.host); err != nil {
			err = fmt.Errorf("replay on another connection: %w", err)
			g.mu.Lock()
			g.err = err
			g.mu.Unlock()
			g.cancel(err)
			stopped = true
		}
	}
	if stopped && info.Conn != nil {
		// net/http checks the context before it gets a connection, not
		// after: a write deadline in the past fails the write before a
		// byte leaves.
		_ = info.Conn.SetWriteDeadline(time.Unix(1, 0))
	}
}

func overHTTP2(info httptrace.GotConnInfo) bool {
	c, ok := info.Conn.(*tls.Conn)
	return ok && c.ConnectionState().NegotiatedProtocol == "h2"
}

// done ends the attempt's context once the attempt is over: when resp's
// body is closed, or at once when there is no response. It returns resp,
// its body wrapped to that end.
func (g *replayGuard) done(resp *http.Response) *http.Response {
	if resp == nil || resp.Body == nil {
		g.cancel(nil)
		return resp
	}
	b := &g.body
	b.ReadCloser, b.cancel = resp.Body, g.cancel
	if w, ok := resp.Body.(io.Writer); ok { // a 101 Switching Protocols body
		resp.Body = &attemptRWBody{attemptBody: b, Writer: w}
	} else {
		resp.Body = b
	}
	return resp
}

// attemptBody is a response body that ends its attempt's context when it
// is closed.
type attemptBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *attemptBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// attemptRWBody is an attemptBody that keeps its body's Write.
type attemptRWBody struct {
	*attemptBody
	io.Writer
}

// stopped returns why a replay was stopped, or nil.
func (g *replayGuard) stopped() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}
