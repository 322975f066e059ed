package backoff_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/backoff"
)

func TestIdempotent(t *testing.T) {
	withKey := func(method, key string, value []string) *http.Request {
		req := httptest.NewRequest(method, "http://example.test/", nil)
		req.Header[key] = value
		return req
	}
	tests := []struct {
		name string
		req  *http.Request
		want bool
	}{
		{"nil", nil, false},
		{"empty method means GET", &http.Request{}, true},
		{"GET", httptest.NewRequest(http.MethodGet, "/", nil), true},
		{"HEAD", httptest.NewRequest(http.MethodHead, "/", nil), true},
		{"OPTIONS", httptest.NewRequest(http.MethodOptions, "/", nil), true},
		{"PUT", httptest.NewRequest(http.MethodPut, "/", nil), true},
		{"DELETE", httptest.NewRequest(http.MethodDelete, "/", nil), true},
		{"TRACE", httptest.NewRequest(http.MethodTrace, "/", nil), true},
		{"POST", httptest.NewRequest(http.MethodPost, "/", nil), false},
		{"PATCH", httptest.NewRequest(http.MethodPatch, "/", nil), false},
		{"CONNECT", httptest.NewRequest(http.MethodConnect, "/", nil), false},
		{"lower-case get is another method", &http.Request{Method: "get"}, false},
		{"POST with Idempotency-Key", withKey(http.MethodPost, "Idempotency-Key", []string{"k1"}), true},
		{"POST with X-Idempotency-Key", withKey(http.MethodPost, "X-Idempotency-Key", []string{"k1"}), true},
		{"POST with nil Idempotency-Key", withKey(http.MethodPost, "Idempotency-Key", nil), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, backoff.Idempotent(tt.req))
		})
	}
}

// realErrors provokes transport errors from real, local servers.
func realErrors(t *testing.T) map[string]error {
	t.Helper()
	errs := make(map[string]error)
	get := func(c *http.Client, u string) error {
		resp, err := c.Get(u)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("GET %s: no error", u)
		}
		return err
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	errs["connection refused"] = get(http.DefaultClient, closed.URL)

	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(hang.Close)
	errs["client timeout"] = get(&http.Client{Timeout: 20 * time.Millisecond}, hang.URL)

	hangup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(hangup.Close)
	errs["server hung up"] = get(http.DefaultClient, hangup.URL)

	loop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.String(), http.StatusFound)
	}))
	t.Cleanup(loop.Close)
	errs["too many redirects"] = get(http.DefaultClient, loop.URL)

	tlsServer := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsServer.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshake is the point
	tlsServer.StartTLS()
	t.Cleanup(tlsServer.Close)
	errs["untrusted certificate"] = get(&http.Client{Transport: &http.Transport{}}, tlsServer.URL)

	errs["unsupported scheme"] = get(http.DefaultClient, "ftp://example.test/")
	errs["bad URL"] = get(http.DefaultClient, "http://[::1")
	return errs
}

func TestRetryableErrors(t *testing.T) {
	provoked := realErrors(t)
	urlErr := func(err error) error { return &url.Error{Op: "Get", URL: "http://example.test/", Err: err} }
	opErr := func(op string, err error) error {
		return urlErr(&net.OpError{Op: op, Net: "tcp", Err: os.NewSyscallError(op, err)})
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"real connection refused", provoked["connection refused"], true},
		{"real client timeout", provoked["client timeout"], true},
		{"real server hung up", provoked["server hung up"], true},
		{"real too many redirects", provoked["too many redirects"], false},
		{"real untrusted certificate", provoked["untrusted certificate"], false},
		{"real unsupported scheme", provoked["unsupported scheme"], false},
		{"real bad URL", provoked["bad URL"], false},
		{"connection refused", opErr("dial", syscall.ECONNREFUSED), true},
		{"connection reset", opErr("read", syscall.ECONNRESET), true},
		{"connection aborted", opErr("read", syscall.ECONNABORTED), true},
		{"broken pipe", opErr("write", syscall.EPIPE), true},
		{"i/o timeout", urlErr(&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}), true},
		{"per-attempt deadline", urlErr(context.DeadlineExceeded), true},
		// A RoundTripper's own error type between the url.Error and the
		// timeout: url.Error's Timeout asks only the error it holds.
		{"wrapped per-attempt deadline", urlErr(&wrapped{context.DeadlineExceeded}), true},
		{"wrapped i/o timeout", urlErr(fmt.Errorf("attempt 2: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded})), true},
		{"joined with a timeout", urlErr(errors.Join(errors.New("slot"), context.DeadlineExceeded)), true},
		// An error that says it did not time out decides, whatever it wraps.
		{"not a timeout, wrapping a deadline", urlErr(&notTimeout{wrapped{context.DeadlineExceeded}}), false},
		{"EOF", urlErr(io.EOF), true},
		{"unexpected EOF", urlErr(io.ErrUnexpectedEOF), true},
		{"canceled by an inner context", urlErr(context.Canceled), false},
		{"DNS name not found", urlErr(&net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", IsNotFound: true}}), false},
		{"DNS timeout", urlErr(&net.OpError{Op: "dial", Err: &net.DNSError{Err: "timeout", IsTimeout: true}}), true},
		{"certificate verification", urlErr(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), false},
		{"certificate hostname", urlErr(x509.HostnameError{Certificate: &x509.Certificate{}, Host: "example.test"}), false},
		{"unknown error", errors.New("boom"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NotNil(t, tt.err)
			require.Equal(t, tt.want, backoff.Retryable(context.Background(), nil, tt.err), "%v", tt.err)
		})
	}
}

func TestTimeout(t *testing.T) {
	require.False(t, backoff.Timeout(nil))
	require.False(t, backoff.Timeout(errors.New("boom")))
	require.True(t, backoff.Timeout(context.DeadlineExceeded))
	require.True(t, backoff.Timeout(fmt.Errorf("a: %w", fmt.Errorf("b: %w", os.ErrDeadlineExceeded))))
	require.True(t, backoff.Timeout(&url.Error{Op: "Get", URL: "http://example.test/", Err: &wrapped{context.DeadlineExceeded}}),
		"past a url.Error, whose own Timeout is false here")
	require.False(t, backoff.Timeout(&notTimeout{wrapped{context.DeadlineExceeded}}), "the outer error decides")
	require.True(t, backoff.Timeout(errors.Join(&notTimeout{wrapped{io.EOF}}, context.DeadlineExceeded)), "any branch of a join")
}

func TestRetryableResponses(t *testing.T) {
	respond := func(status int, method string, header ...string) *http.Response {
		req := httptest.NewRequest(method, "http://example.test/", nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		return &http.Response{StatusCode: status, Request: req}
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		resp *http.Response
		err  error
		want bool
	}{
		{"200", context.Background(), respond(200, "GET"), nil, false},
		{"404", context.Background(), respond(404, "GET"), nil, false},
		{"429", context.Background(), respond(429, "GET"), nil, true},
		{"500", context.Background(), respond(500, "GET"), nil, false},
		{"501", context.Background(), respond(501, "GET"), nil, false},
		{"502", context.Background(), respond(502, "GET"), nil, true},
		{"503", context.Background(), respond(503, "GET"), nil, true},
		{"504", context.Background(), respond(504, "GET"), nil, true},
		{"503 without request", context.Background(), &http.Response{StatusCode: 503}, nil, true},
		{"503 to POST", context.Background(), respond(503, "POST"), nil, false},
		{"503 to POST with Idempotency-Key", context.Background(), respond(503, "POST", "Idempotency-Key", "k1"), nil, true},
		{"nothing at all", context.Background(), nil, nil, false},
		{"context ended, 503", canceled, respond(503, "GET"), nil, false},
		{"context ended, connection reset", canceled, nil, syscall.ECONNRESET, false},
		{"context ended, its own error", canceled, nil, context.Canceled, false},
		{"response and transient error", context.Background(), respond(200, "GET"), io.ErrUnexpectedEOF, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, backoff.Retryable(tt.ctx, tt.resp, tt.err))
		})
	}
}

// wrapped is a RoundTripper's error with no Timeout method of its own.
type wrapped struct{ err error }

func (w *wrapped) Error() string { return "attempt failed: " + w.err.Error() }
func (w *wrapped) Unwrap() error { return w.err }

// notTimeout is an error that knows it is no timeout, whatever its cause.
type notTimeout struct{ wrapped }

func (*notTimeout) Timeout() bool { return false }
