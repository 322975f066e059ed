package transport_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/backoff"
	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

func TestRetriesWaitOnTheQuota(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, statuses(503, 503, 200))
	thr := newThrottler(t, "2/200ms", throttle.WithMargin(0))
	var rec attempts
	rt := transport.New(nil, thr, fastRetries(), rec.option(), transport.WithAttemptsHeader("X-Fleetgate-Attempts"))

	resp, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
	if err != nil {
		t.Fatal(err)
	}
	require.Equal(t, 200, resp.StatusCode, "status")
	require.Equal(t, "3", resp.Header.Get("X-Fleetgate-Attempts"), "attempts header")
	require.Equal(t, []int{503, 503, 200}, rec.statuses(), "statuses seen by OnAttempt")

	a := tg.seen()
	require.Equal(t, 3, len(a), "arrivals")
	// Two fit in the window at once; the third waits for the first to
	// leave it, 200ms later.
	between(t, 0, 150*time.Millisecond, a[1].at.Sub(a[0].at), "second attempt after the first")
	between(t, 180*time.Millisecond, 600*time.Millisecond, a[2].at.Sub(a[0].at), "third attempt after the first")
	infos := rec.all()
	between(t, 150*time.Millisecond, 600*time.Millisecond, infos[2].Waited, "third attempt's wait")
}

func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		req          func(t *testing.T, url string) *http.Request
		opts         []transport.Option
		wantArrivals int
		wantBodies   []string
	}{
		{
			name:         "GET is retried",
			req:          func(t *testing.T, url string) *http.Request { return get(t, t.Context(), url) },
			wantArrivals: 3,
		},
		{
			name: "a replayable body is sent again identically",
			req: func(t *testing.T, url string) *http.Request {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, url, strings.NewReader("payload"))
				if err != nil {
					t.Fatal(err)
				}
				return req
			},
			wantArrivals: 3,
			wantBodies:   []string{"payload", "payload", "payload"},
		},
		{
			name: "a body without GetBody is sent once",
			req: func(t *testing.T, url string) *http.Request {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, url, nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Body = io.NopCloser(strings.NewReader("once"))
				return req
			},
			wantArrivals: 1,
			wantBodies:   []string{"once"},
		},
		{
			name: "POST is not retried",
			req: func(t *testing.T, url string) *http.Request {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader("x"))
				if err != nil {
					t.Fatal(err)
				}
				return req
			},
			wantArrivals: 1,
		},
		{
			name: "POST with an Idempotency-Key is retried",
			req: func(t *testing.T, url string) *http.Request {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader("x"))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Idempotency-Key", "k1")
				return req
			},
			wantArrivals: 3,
			wantBodies:   []string{"x", "x", "x"},
		},
		{
			name:         "WithoutRetries sends once",
			req:          func(t *testing.T, url string) *http.Request { return get(t, t.Context(), url) },
			opts:         []transport.Option{transport.WithoutRetries()},
			wantArrivals: 1,
		},
		{
			name:         "WithRetries(2) sends twice",
			req:          func(t *testing.T, url string) *http.Request { return get(t, t.Context(), url) },
			opts:         []transport.Option{transport.WithRetries(2)},
			wantArrivals: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tg := newTarget(t, statuses(503, 503, 200))
			thr := newThrottler(t, "100/1s")
			opts := append([]transport.Option{fastRetries(), transport.WithAttemptsHeader("X-Attempts")}, tt.opts...)
			rt := transport.New(nil, thr, opts...)

			resp, err := roundTrip(t, rt, tt.req(t, tg.URL))
			if err != nil {
				t.Fatal(err)
			}
			a := tg.seen()
			require.Equal(t, tt.wantArrivals, len(a), "arrivals")
			require.Equal(t, []int{503, 503, 200}[tt.wantArrivals-1], resp.StatusCode, "status of the last attempt")
			require.Equal(t, []string{strconv.Itoa(tt.wantArrivals)}, resp.Header.Values("X-Attempts"), "attempts header")
			if tt.wantBodies != nil {
				var bodies []string
				for _, x := range a {
					bodies = append(bodies, x.body)
				}
				require.Equal(t, tt.wantBodies, bodies, "bodies received")
			}
		})
	}
}

func TestDiscardedResponsesAreClosed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		size      int   // of each 503's body
		wantConns int64 // connections the target sees
	}{
		// Small bodies are drained, so one connection serves every attempt.
		{name: "small bodies", size: 1 << 10, wantConns: 1},
		// Past 64 KiB the body is closed unread and its connection dropped.
		{name: "large bodies", size: 1 << 20, wantConns: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			big := strings.Repeat("x", tt.size)
			tg := newTarget(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n < 2 {
					w.WriteHeader(503)
					_, _ = io.WriteString(w, big)
					return
				}
				_, _ = io.WriteString(w, "final")
			})
			base := &tracker{base: &http.Transport{}}
			rt := transport.New(base, newThrottler(t, "100/1s"), fastRetries())

			resp, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
			if err != nil {
				t.Fatal(err)
			}
			bodies := base.all()
			require.Equal(t, 3, len(bodies), "responses")
			for i, b := range bodies[:2] {
				require.Equal(t, true, b.closed.Load(), "discarded body closed")
				if b.read.Load() > 64<<10+4<<10 {
					t.Fatalf("discarded body %d: read %d bytes, want at most about 64 KiB", i, b.read.Load())
				}
			}
			require.Equal(t, false, bodies[2].closed.Load(), "returned body still open")
			data, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			require.Equal(t, "final", string(data), "final body")
			_ = resp.Body.Close()
			require.Equal(t, tt.wantConns, tg.opened.Load(), "connections opened")

			// Nothing holds a connection: once idle ones are closed, the
			// target sees every connection closed.
			rt.CloseIdleConnections()
			deadline := time.Now().Add(2 * time.Second)
			for tg.closed.Load() < tg.opened.Load() && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			require.Equal(t, tg.opened.Load(), tg.closed.Load(), "connections closed")
		})
	}
}

func TestRequestIsNotModified(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Check") != "v" {
			w.WriteHeader(400)
			return
		}
		w.WriteHeader([]int{429, 503, 200}[min(n, 2)])
	})
	rt := transport.New(nil, newThrottler(t, "100/1s"), fastRetries(),
		transport.WithPauseBackoff(nil), transport.WithMaxRetryAfter(time.Millisecond))
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, tg.URL+"/p?q=1", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Check", "v")
	body, getBody := req.Body, req.GetBody
	before := *req
	beforeHeader, beforeURL := req.Header.Clone(), *req.URL

	resp, err := roundTrip(t, rt, req)
	if err != nil {
		t.Fatal(err)
	}
	require.Equal(t, 200, resp.StatusCode, "status")
	require.Equal(t, beforeHeader, req.Header, "header")
	require.Equal(t, beforeURL, *req.URL, "URL")
	require.Equal(t, before.Method, req.Method, "method")
	require.Equal(t, before.ContentLength, req.ContentLength, "content length")
	require.Equal(t, before.Host, req.Host, "host")
	require.Equal(t, before.Trailer, req.Trailer, "trailer")
	if req.Body != body || req.GetBody == nil || getBody == nil {
		t.Fatal("request body or GetBody replaced")
	}
	if resp.Request == req {
		t.Fatal("the caller's request was sent instead of a clone")
	}
}

func TestBaseBreakingTheContract(t *testing.T) {
	t.Parallel()
	body := &trackedBody{ReadCloser: io.NopCloser(strings.NewReader("x"))}
	cause := errors.New("both")
	bad := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: body, Header: http.Header{}}, cause
	})
	rt := transport.New(bad, newThrottler(t, "100/1s"))
	resp, err := roundTrip(t, rt, get(t, t.Context(), "http://example.com/"))
	if resp != nil || !errors.Is(err, cause) {
		t.Fatalf("want only the error, got %v, %v", resp, err)
	}
	require.Equal(t, true, body.closed.Load(), "response body closed")
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestNetworkErrorsAreRetriedAndNamed(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // connections are now refused
	var rec attempts
	rt := transport.New(nil, newThrottler(t, "100/1s"), fastRetries(), transport.WithRetries(3), rec.option())

	_, err = roundTrip(t, rt, get(t, t.Context(), "http://"+addr+"/"))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("want an error wrapping ECONNREFUSED, got %v", err)
	}
	var te *transport.Error
	if !errors.As(err, &te) {
		t.Fatalf("want a *transport.Error, got %T", err)
	}
	require.Equal(t, addr, te.Host, "host")
	require.Equal(t, 3, te.Attempt, "attempt")
	if !strings.Contains(err.Error(), "attempt 3") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %q does not name the attempt and host", err)
	}
	infos := rec.all()
	require.Equal(t, 3, len(infos), "attempts reported")
	for _, i := range infos {
		if i.Err == nil || i.Status != 0 {
			t.Fatalf("attempt %d: want an error and no status, got %+v", i.Attempt, i)
		}
	}
}

func TestFailureBeforeSending(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		url  string
		ctx  func(t *testing.T) context.Context
		want error
	}{
		{
			name: "ctx cancelled during the wait",
			ctx: func(t *testing.T) context.Context {
				ctx, cancel := context.WithCancel(t.Context())
				time.AfterFunc(50*time.Millisecond, cancel)
				return ctx
			},
			want: context.Canceled,
		},
		{
			name: "ctx cancelled before",
			ctx: func(t *testing.T) context.Context {
				ctx, cancel := context.WithCancel(t.Context())
				cancel()
				return ctx
			},
			want: context.Canceled,
		},
		{
			name: "slot past the deadline",
			ctx: func(t *testing.T) context.Context {
				ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
				t.Cleanup(cancel)
				return ctx
			},
			want: context.DeadlineExceeded,
		},
		{
			name: "bad target",
			url:  "http://bad_host!/",
			ctx:  func(t *testing.T) context.Context { return t.Context() },
			want: throttle.ErrBadTarget,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tg := newTarget(t, statuses(200))
			thr := newThrottler(t, "1/10s")
			var rec attempts
			rt := transport.New(nil, thr, rec.option())
			// The first request takes the only slot for 10s.
			if _, err := roundTrip(t, rt, get(t, t.Context(), tg.URL)); err != nil {
				t.Fatal(err)
			}

			url := tg.URL
			if tt.url != "" {
				url = tt.url
			}
			body := &requestBody{Reader: strings.NewReader("payload")}
			req, err := http.NewRequestWithContext(tt.ctx(t), http.MethodPut, url, body)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = roundTrip(t, rt, req)
			if !errors.Is(err, tt.want) {
				t.Fatalf("want an error wrapping %v, got %v", tt.want, err)
			}
			between(t, 0, time.Second, time.Since(start), "time to fail")
			var te *transport.Error
			if !errors.As(err, &te) || te.Attempt != 1 {
				t.Fatalf("want a *transport.Error for attempt 1, got %#v", err)
			}
			require.Equal(t, true, body.closed.Load(), "request body closed")
			require.Equal(t, 1, len(tg.seen()), "arrivals")
			infos := rec.all()
			if last := infos[len(infos)-1]; !errors.Is(last.Err, tt.want) {
				t.Fatalf("OnAttempt: want the error, got %+v", last)
			}
		})
	}
}

func TestCancelledWaitReleasesTheSlot(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, statuses(200))
	thr := newThrottler(t, "1/300ms", throttle.WithMargin(0))
	rt := transport.New(nil, thr)
	if _, err := roundTrip(t, rt, get(t, t.Context(), tg.URL)); err != nil {
		t.Fatal(err)
	}
	// This one books the slot at +300ms, then gives up.
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := roundTrip(t, rt, get(t, ctx, tg.URL)); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	// The next takes the released slot instead of the one after it.
	if _, err := roundTrip(t, rt, get(t, t.Context(), tg.URL)); err != nil {
		t.Fatal(err)
	}
	a := tg.seen()
	require.Equal(t, 2, len(a), "arrivals")
	between(t, 250*time.Millisecond, 500*time.Millisecond, a[1].at.Sub(a[0].at), "second arrival after the first")
}

// TestCancelledWithACause: a context cancelled with a cause, during the
// quota wait or the delay before a retry, fails the request with an error
// that matches both context.Canceled and the cause.
func TestCancelledWithACause(t *testing.T) {
	t.Parallel()
	errShutdown := errors.New("shutting down")
	for _, tc := range []struct {
		name string
		rule string
		code int
		// cancel cancels ctx with the cause, once the request is where
		// the case wants it; l is the Transport's log.
		cancel  func(cancel context.CancelCauseFunc, l *logs)
		attempt int    // the attempt the error names
		want    string // in the error
	}{
		{
			name: "in the quota wait",
			rule: "1/1h", // the second request's slot is an hour away
			code: http.StatusOK,
			cancel: func(cancel context.CancelCauseFunc, _ *logs) {
				time.AfterFunc(50*time.Millisecond, func() { cancel(errShutdown) })
			},
			attempt: 1,
			want:    "context canceled: shutting down",
		},
		{
			name: "in the retry delay",
			rule: "100/1s",
			code: http.StatusBadGateway, // retried after an hour
			cancel: func(cancel context.CancelCauseFunc, l *logs) {
				// Logged once the retry is decided, just before its
				// delay: the hour-long delay is the only wait left for
				// the cancel to land in.
				retrying := l.await("DEBUG fleetgate: retrying")
				go func() {
					<-retrying
					cancel(errShutdown)
				}()
			},
			attempt: 2,
			want:    "delay before retry: context canceled: shutting down",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tg := newTarget(t, statuses(tc.code))
			var l logs
			rt := transport.New(nil, newThrottler(t, tc.rule), transport.WithLogger(l.logger()),
				transport.WithBackoff(&backoff.Exponential{Base: time.Hour, Max: time.Hour, Jitter: backoff.NoJitter}))
			if tc.code == http.StatusOK {
				_, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
				require.NoError(t, err)
			}
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			tc.cancel(cancel, &l)
			_, err := roundTrip(t, rt, get(t, ctx, tg.URL))
			require.ErrorIs(t, err, context.Canceled)
			require.ErrorIs(t, err, errShutdown)
			var te *transport.Error
			require.ErrorAs(t, err, &te)
			require.Equal(t, tc.attempt, te.Attempt, "attempt")
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestCancelledWithACauseInFlight: a context cancelled with a cause while
// the attempt is in flight (the target has the request and has not
// answered) fails the request with an error that matches both
// context.Canceled and the cause, as a cancel in the quota wait does.
func TestCancelledWithACauseInFlight(t *testing.T) {
	t.Parallel()
	errShutdown := errors.New("shutting down")
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	tg := newTarget(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select { // held until the client gives up on it
		case <-r.Context().Done():
		case <-release:
		}
		w.WriteHeader(http.StatusOK)
	})
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for the handler
	var rec attempts
	rt := transport.New(nil, newThrottler(t, "100/1s"), rec.option())
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	go func() {
		<-arrived
		cancel(errShutdown)
	}()
	_, err := roundTrip(t, rt, get(t, ctx, tg.URL))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, errShutdown)
	var te *transport.Error
	require.ErrorAs(t, err, &te)
	require.Equal(t, 1, te.Attempt, "attempt")
	require.Equal(t, 1, len(tg.seen()), "arrivals")
	infos := rec.all()
	require.Equal(t, 1, len(infos), "attempts reported")
	require.ErrorIs(t, infos[0].Err, context.Canceled, "OnAttempt")
	require.ErrorIs(t, infos[0].Err, errShutdown, "OnAttempt")
}

// TestDeadlineWithACauseInFlight: a deadline given a cause that passes
// while the attempt is in flight fails the request with an error that
// matches both context.DeadlineExceeded and the cause, and reports a
// timeout. The base blocks until its request's context ends and then
// returns that context's cause, as net/http does; in the bubble, time
// reaches the deadline only once the base blocks.
func TestDeadlineWithACauseInFlight(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		errSlow := errors.New("too slow")
		var sent atomic.Bool
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			sent.Store(true)
			<-req.Context().Done()
			return nil, context.Cause(req.Context())
		})
		rt := transport.New(base, newThrottler(t, "100/1s"))
		ctx, cancel := context.WithTimeoutCause(t.Context(), time.Minute, errSlow)
		defer cancel()
		_, err := roundTrip(t, rt, get(t, ctx, "http://in-flight.example/"))
		require.True(t, sent.Load(), "the deadline passed before the attempt was sent: %v", err)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, errSlow)
		var te *transport.Error
		require.ErrorAs(t, err, &te)
		require.True(t, te.Timeout(), "Timeout of %v", err)
	})
}

func TestDeadlineStopsRetrying(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		status     int
		retryAfter string
	}{
		{name: "Retry-After past the deadline", status: 503, retryAfter: "1"},
		// No Retry-After: the 429 pauses the target for 0.5s to 1s.
		{name: "pause past the deadline", status: 429},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tg := newTarget(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
			})
			rt := transport.New(nil, newThrottler(t, "100/1s"), fastRetries())
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			resp, err := roundTrip(t, rt, get(t, ctx, tg.URL))
			if err != nil {
				t.Fatal(err)
			}
			// The next attempt could not be sent in time: the response
			// comes back at once.
			require.Equal(t, tt.status, resp.StatusCode, "status")
			between(t, 0, 200*time.Millisecond, time.Since(start), "time to return")
			require.Equal(t, 1, len(tg.seen()), "arrivals")
		})
	}
}

func TestNoSlotBeforeTheDeadlineReturnsTheLastResponse(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(503) // no Retry-After: no pause, a retry is due at once
		_, _ = io.WriteString(w, "busy")
	})
	rt := transport.New(nil, newThrottler(t, "1/1s", throttle.WithMargin(0)), fastRetries())
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := roundTrip(t, rt, get(t, ctx, tg.URL))
	if err != nil {
		t.Fatal(err)
	}
	// The quota's next slot, a second on, lies past the deadline: the
	// 503 is the answer, body and all.
	require.Equal(t, 503, resp.StatusCode, "status")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "busy", string(body))
	between(t, 0, 300*time.Millisecond, time.Since(start), "time to return")
	require.Equal(t, 1, len(tg.seen()), "arrivals")
}

func TestReplayFailure(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, tg.URL, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("gone")
	req.GetBody = func() (io.ReadCloser, error) { return nil, cause }
	var infos []transport.AttemptInfo
	rt := transport.New(nil, newThrottler(t, "100/1s"), fastRetries(),
		transport.OnAttempt(func(a transport.AttemptInfo) { infos = append(infos, a) }))
	resp, err := roundTrip(t, rt, req)
	// The second attempt cannot be sent: the first one's answer is the
	// answer, body and all, rather than an error that hides it.
	require.NoError(t, err)
	require.Equal(t, 503, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "busy\n", string(body))
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 1, len(tg.seen()), "arrivals")
	require.Len(t, infos, 2)
	require.ErrorIs(t, infos[1].Err, cause, "the attempt that could not be sent is reported")
}

func TestOneStoreCallUnderTheLimit(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, statuses(200))
	store := &countingStore{MemoryStore: throttle.NewMemoryStore()}
	t.Cleanup(func() { _ = store.Close() })
	rt := transport.New(nil, newThrottler(t, "1000/1s", throttle.WithStore(store)))
	const n = 20
	for range n {
		resp, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	require.Equal(t, int64(n), store.reserves.Load(), "Reserve calls")
	require.Equal(t, int64(0), store.pauses.Load(), "Pause calls")
	require.Equal(t, int64(0), store.cancels.Load(), "Cancel calls")
}

func TestSlotBookedBeforeAPauseWaitsItOut(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, statuses(200))
	thr := newThrottler(t, "1/200ms", throttle.WithMargin(0))
	var rec attempts
	rt := transport.New(nil, thr, rec.option())
	if _, err := roundTrip(t, rt, get(t, t.Context(), tg.URL)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	req := get(t, t.Context(), tg.URL)
	wg.Go(func() {
		// Books the slot at +200ms and sleeps.
		sendAsync(t, rt, req)
	})
	// Another worker hears a 429 meanwhile.
	time.Sleep(50 * time.Millisecond)
	if _, err := thr.Pause(t.Context(), tg.host, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	a := tg.seen()
	require.Equal(t, 2, len(a), "arrivals")
	between(t, 530*time.Millisecond, 900*time.Millisecond, a[1].at.Sub(a[0].at), "second arrival after the first")
	between(t, 480*time.Millisecond, 900*time.Millisecond, rec.all()[1].Waited, "second request's wait")
}

// TestAttemptTimeoutBoundsEachAttemptNotTheQuota: an attempt that hangs is
// cut at the attempt timeout and retried; the retry's wait on the quota,
// longer than the timeout, does not count against it.
func TestAttemptTimeoutBoundsEachAttemptNotTheQuota(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			<-r.Context().Done() // hangs until the client gives up
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	var infos []transport.AttemptInfo
	rt := transport.New(nil, newThrottler(t, "1/400ms", throttle.WithMargin(0)), fastRetries(),
		transport.WithAttemptTimeout(150*time.Millisecond),
		transport.OnAttempt(func(a transport.AttemptInfo) { infos = append(infos, a) }))
	start := time.Now()
	resp, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, "ok", string(body))
	require.Len(t, infos, 2)
	require.ErrorIs(t, infos[0].Err, context.DeadlineExceeded, "the first attempt ran out")
	require.GreaterOrEqual(t, infos[1].Waited, 200*time.Millisecond, "the retry waited on the quota longer than the timeout")
	between(t, 400*time.Millisecond, 3*time.Second, time.Since(start), "time to the answer")
}

// TestAttemptTimeoutIsATimeoutUnderAClient: an attempt cut by its bound
// fails, through an http.Client, with an *url.Error whose Timeout is true,
// so that go-retryablehttp with backoff.CheckRetry (the README's set-up,
// the Transport's own retries off) retries it.
func TestAttemptTimeoutIsATimeoutUnderAClient(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n < 2 {
			<-r.Context().Done() // hangs until the client gives up
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	rt := transport.New(nil, newThrottler(t, "100/1s"), transport.WithoutRetries(),
		transport.WithAttemptTimeout(100*time.Millisecond))

	_, err := (&http.Client{Transport: rt}).Get(tg.URL)
	var ue *url.Error
	require.ErrorAs(t, err, &ue)
	require.True(t, ue.Timeout(), "url.Error.Timeout of %v", err)
	require.True(t, backoff.Retryable(context.Background(), nil, err), "Retryable(%v)", err)

	rc := retryablehttp.NewClient()
	rc.HTTPClient.Transport = rt
	rc.Backoff = backoff.RetryableHTTPBackoff(&backoff.Exponential{Base: time.Millisecond, Max: time.Millisecond}, 0)
	rc.CheckRetry = backoff.CheckRetry
	rc.Logger = nil
	rc.RetryMax = 2
	resp, err := rc.Get(tg.URL)
	require.NoError(t, err, "the attempt that timed out is retried")
	require.NoError(t, resp.Body.Close())
	require.Len(t, tg.seen(), 3, "the first request, hung; then its two attempts here: one hung, one answered")
}

// TestNoSlotBeforeTheDeadlineIsNoTimeout: a request the quota has no slot
// for before the caller's deadline fails fast, and not as a timeout: a
// retry within that deadline would find no slot either.
func TestNoSlotBeforeTheDeadlineIsNoTimeout(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, statuses(http.StatusOK))
	thr := newThrottler(t, "1/10s")
	_, err := thr.ReserveN(t.Context(), tg.host, 1) // the next slot is 10 s away
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tg.URL, nil)
	require.NoError(t, err)
	_, err = (&http.Client{Transport: transport.New(nil, thr, transport.WithAttemptTimeout(100*time.Millisecond))}).Do(req)
	require.ErrorIs(t, err, throttle.ErrWouldExceedDeadline)
	var ue *url.Error
	require.ErrorAs(t, err, &ue)
	require.False(t, ue.Timeout(), "no slot is no timeout: %v", err)
	require.False(t, backoff.Retryable(ctx, nil, err), "Retryable(%v)", err)
	require.Empty(t, tg.seen())
}

// TestAttemptTimeoutBoundsTheWaitAtTheConnection: the second wait on the
// quota, at a connection that came too late for the slot, counts against
// the attempt's bound: when a fleet-wide pause that ends past the bound
// began meanwhile, the attempt fails as timed out without being sent (not
// sent when the pause ends, after its bound, as it was), and is retried
// like any attempt that timed out: after the pause.
func TestAttemptTimeoutBoundsTheWaitAtTheConnection(t *testing.T) {
	t.Parallel()
	for _, retries := range []bool{false, true} {
		t.Run(fmt.Sprintf("retries=%v", retries), func(t *testing.T) {
			t.Parallel()
			tg := newTarget(t, statuses(http.StatusOK))
			thr := newThrottler(t, "10/1s")
			var paused atomic.Bool
			const pause = time.Second
			base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if !paused.Swap(true) {
					time.Sleep(3 * throttle.MinStale) // the slot goes stale
					_, _ = thr.Pause(context.Background(), tg.host, pause)
				}
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}}
			t.Cleanup(base.CloseIdleConnections)
			opts := []transport.Option{transport.WithAttemptTimeout(300 * time.Millisecond), fastRetries()}
			if !retries {
				opts = append(opts, transport.WithoutRetries())
			}
			start := time.Now()
			resp, err := roundTrip(t, transport.New(base, thr, opts...), get(t, t.Context(), tg.URL))
			took := time.Since(start)
			if !retries {
				require.ErrorIs(t, err, context.DeadlineExceeded)
				var te *transport.Error
				require.ErrorAs(t, err, &te)
				require.True(t, te.Timeout(), "the attempt timed out: %v", err)
				// The slot after the pause lies past the attempt's bound:
				// refused at once, not waited for.
				require.Less(t, took, pause, "time to the error")
				require.Empty(t, tg.seen(), "the attempt was not sent")
				return
			}
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			a := tg.seen()
			require.Len(t, a, 1, "one request reached the target: the retry's")
			require.GreaterOrEqual(t, a[0].at.Sub(start), pause, "sent after the pause")
		})
	}
}

// TestAttemptTimeoutCoversTheBody: the bound runs until the body is read,
// so a body that stalls after the headers fails rather than hangs.
func TestAttemptTimeoutCoversTheBody(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, func(n int, w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	rt := transport.New(nil, newThrottler(t, "100/1s"), transport.WithoutRetries(),
		transport.WithAttemptTimeout(150*time.Millisecond))
	start := time.Now()
	resp, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	_, err = io.ReadAll(resp.Body)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, resp.Body.Close())
	between(t, 100*time.Millisecond, 2*time.Second, time.Since(start), "time to the failed read")
}

// baseFunc is a base RoundTripper made of a function.
type baseFunc func(*http.Request) (*http.Response, error)

func (f baseFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestRetryLogsHideTheURLsPassword: a base whose errors quote the
// request's URL, password and all (a *url.Error of its own), does not put
// the password in the retry's log line, escaped or not, nor in the text of
// the error RoundTrip returns; nor a user without a password, most often a
// token.
func TestRetryLogsHideTheURLsPassword(t *testing.T) {
	for _, tc := range []struct {
		url, shown, secret string
		cause              string // the error's own text after the URL
	}{
		{"http://alice:" + url.PathEscape("s3cr/et") + "@example.test/x", "alice:xxxxx@example.test", "s3cr", "reset by s3cr/et"},
		{"http://T0ken%2FLeak@example.test/x", "//xxxxx@example.test", "Leak", "reset"},
		{"http://T0kenLeak:@example.test/x", "//xxxxx@example.test", "Leak", "reset"}, // curl -u TOKEN:
	} {
		base := baseFunc(func(req *http.Request) (*http.Response, error) {
			return nil, &url.Error{Op: "Get", URL: req.URL.String(), Err: fmt.Errorf("%s: %w", tc.cause, syscall.ECONNRESET)}
		})
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		tr := transport.New(base, newThrottler(t, "100/1s"), fastRetries(), transport.WithRetries(2), transport.WithLogger(log))
		req, err := http.NewRequest(http.MethodGet, tc.url, nil)
		require.NoError(t, err)
		_, err = tr.RoundTrip(req)
		require.Error(t, err)
		out := buf.String()
		require.Contains(t, out, "fleetgate: retrying")
		require.Contains(t, out, tc.shown)
		require.NotContains(t, out, tc.secret)
		require.Contains(t, err.Error(), tc.shown)
		require.NotContains(t, err.Error(), tc.secret)
		require.ErrorIs(t, err, syscall.ECONNRESET, "the cause itself is kept")
	}
}
