package main

import (
	"context"
	"io"
	"net/http"
	"time"
)

// defaultAPITimeout is -api-timeout's default: far more than a lookup of
// one country takes, far less than a job should sit on an API that hangs.
const defaultAPITimeout = 10 * time.Second

// attemptTimeout is the base RoundTripper under the throttled transport,
// so it sees each attempt only once the quota has let it go: it bounds the
// attempt by timeout, from that moment until its response's body is
// closed (the connection, the request, the answer's headers and the whole
// body). The wait on the quota before the attempt is not counted; a second
// wait the transport makes when the connection came too late for the
// attempt's slot (see package transport) is. An attempt that runs out of
// time fails with an error that matches context.DeadlineExceeded, and the
// transport retries it like any other timeout.
type attemptTimeout struct {
	base    http.RoundTripper
	timeout time.Duration
}

// RoundTrip sends one attempt under its own deadline.
func (t *attemptTimeout) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(req.Context(), t.timeout)
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose ends an attempt's context when its body is closed, so the
// deadline covers reading the body and its timer is released after.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

// Close closes the body and releases the attempt's timer.
func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
