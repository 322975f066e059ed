package backoff

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"syscall"
)

// transientErrors are the causes of a failed attempt that pass if the
// request is sent again.
var transientErrors = []error{
	syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
	io.EOF, io.ErrUnexpectedEOF,
}

// Idempotent reports whether req may be sent again without changing its
// effect: its method is GET (or empty, which means GET), HEAD, OPTIONS,
// PUT, DELETE or TRACE, or it carries an Idempotency-Key or
// X-Idempotency-Key header. As in net/http, a header key present with a
// nil value counts. Whether the body can be replayed (GetBody) is the
// caller's concern. A nil req is not idempotent.
func Idempotent(req *http.Request) bool {
	if req == nil {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions,
		http.MethodPut, http.MethodDelete, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// Retryable reports whether an attempt that ended with resp and err is
// worth retrying. ctx is the request's context and must not be nil.
//
// It is false once ctx is done, and false when resp.Request is known and
// not [Idempotent]. Otherwise an error is retryable only if it is known to
// be transient: a timeout (the first error in err's chain with a Timeout
// method, an *url.Error aside, reports true: a network timeout, a
// per-attempt deadline inside ctx, a fleetgate transport's attempt that
// timed out, but not one the quota had no slot for), a refused, reset or
// aborted connection, a broken pipe, or a connection closed early
// (io.EOF, io.ErrUnexpectedEOF). Every other error is final: TLS
// certificate failures, too many redirects, a bad URL or unsupported
// scheme, context.Canceled, and whatever is unknown. Without an error, a
// response is retryable if its status is 429, 502, 503 or 504.
func Retryable(ctx context.Context, resp *http.Response, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if resp != nil && resp.Request != nil && !Idempotent(resp.Request) {
		return false
	}
	if err != nil {
		return transient(err)
	}
	if resp == nil {
		return false
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// transient reports whether err is known to pass if the request is sent
// again.
func transient(err error) bool {
	if Timeout(err) {
		return true
	}
	for _, target := range transientErrors {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// Timeout reports whether err is a timeout, as [Retryable] judges it: the
// first error in its chain (depth first) with a Timeout method says, past
// any *url.Error, whose Timeout asks only the error it holds and not what
// that one wraps (a RoundTripper's error that wraps a timeout). So an
// error that knows better than its cause decides: a fleetgate transport's
// error for an attempt the quota had no slot for in time wraps
// context.DeadlineExceeded, but did not time out. A nil err is none.
func Timeout(err error) bool {
	for err != nil {
		if _, ok := err.(*url.Error); !ok {
			if t, ok := err.(interface{ Timeout() bool }); ok {
				return t.Timeout()
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if Timeout(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}
