package transport_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/backoff"
	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

// between fails the test when d is outside [lo, hi].
func between(t testing.TB, lo, hi, d time.Duration, what string) {
	t.Helper()
	require.GreaterOrEqual(t, d, lo, what)
	require.LessOrEqual(t, d, hi, what)
}

// fastRetries makes the delay between attempts about 1ms, so tests measure
// the quota, not the backoff.
func fastRetries() transport.Option {
	return transport.WithBackoff(&backoff.Exponential{Base: time.Millisecond, Max: time.Millisecond, Jitter: backoff.NoJitter})
}

func newThrottler(t testing.TB, rule string, opts ...throttle.Option) *throttle.Throttler {
	t.Helper()
	rules, err := throttle.ParseRules("*=" + rule)
	if err != nil {
		t.Fatal(err)
	}
	thr, err := throttle.New(rules, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = thr.Close() })
	return thr
}

// arrival is one request as the target saw it.
type arrival struct {
	at     time.Time
	method string
	body   string
}

// answer writes the response to the n-th request (from 0).
type answer func(n int, w http.ResponseWriter, r *http.Request)

// target is an httptest server that records every arrival and counts its
// connections.
type target struct {
	*httptest.Server
	host string // host:port, as in URLs

	mu       sync.Mutex
	arrivals []arrival
	answer   answer

	opened, closed atomic.Int64
}

func newTarget(t testing.TB, a answer) *target {
	t.Helper()
	tg := &target{answer: a}
	tg.Server = httptest.NewUnstartedServer(http.HandlerFunc(tg.serve))
	tg.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			tg.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			tg.closed.Add(1)
		}
	}
	tg.Start()
	t.Cleanup(tg.Close)
	tg.host = strings.TrimPrefix(tg.URL, "http://")
	return tg
}

func (tg *target) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	tg.mu.Lock()
	n := len(tg.arrivals)
	tg.arrivals = append(tg.arrivals, arrival{at: time.Now(), method: r.Method, body: string(body)})
	tg.mu.Unlock()
	if tg.answer != nil {
		tg.answer(n, w, r)
	}
}

func (tg *target) seen() []arrival {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return append([]arrival(nil), tg.arrivals...)
}

// statuses answers the n-th request with codes[n] (the last code from then
// on) and an empty body.
func statuses(codes ...int) answer {
	return func(n int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(codes[min(n, len(codes)-1)])
	}
}

// roundTrip sends req through rt and checks the RoundTripper contract on
// the way out: a response always comes with a nil error.
func roundTrip(t testing.TB, rt http.RoundTripper, req *http.Request) (*http.Response, error) {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if resp != nil && err != nil {
		t.Fatalf("RoundTrip returned a response (%d) and an error: %v", resp.StatusCode, err)
	}
	if resp == nil && err == nil {
		t.Fatal("RoundTrip returned neither a response nor an error")
	}
	if resp != nil {
		t.Cleanup(func() { _ = resp.Body.Close() })
	}
	return resp, err
}

// sendAsync is roundTrip for goroutines other than the test's: it reports
// failures with t.Error and closes the response.
func sendAsync(t testing.TB, rt http.RoundTripper, req *http.Request) {
	resp, err := rt.RoundTrip(req)
	switch {
	case resp != nil && err != nil:
		t.Errorf("RoundTrip returned a response (%d) and an error: %v", resp.StatusCode, err)
	case err != nil:
		t.Error(err)
	}
	if resp != nil {
		_ = resp.Body.Close()
	}
}

func get(t testing.TB, ctx context.Context, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// attempts records what OnAttempt reports.
type attempts struct {
	mu    sync.Mutex
	infos []transport.AttemptInfo
}

func (a *attempts) option() transport.Option {
	return transport.OnAttempt(func(i transport.AttemptInfo) {
		a.mu.Lock()
		a.infos = append(a.infos, i)
		a.mu.Unlock()
	})
}

func (a *attempts) statuses() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	var s []int
	for _, i := range a.infos {
		s = append(s, i.Status)
	}
	return s
}

func (a *attempts) all() []transport.AttemptInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]transport.AttemptInfo(nil), a.infos...)
}

// trackedBody records whether it was closed and how much was read.
type trackedBody struct {
	io.ReadCloser
	read   atomic.Int64
	closed atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *trackedBody) Close() error {
	b.closed.Store(true)
	return b.ReadCloser.Close()
}

// tracker is a base RoundTripper that tracks every response body.
type tracker struct {
	base http.RoundTripper

	mu     sync.Mutex
	bodies []*trackedBody
}

func (tr *tracker) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := tr.base.RoundTrip(req)
	if resp != nil {
		b := &trackedBody{ReadCloser: resp.Body}
		resp.Body = b
		tr.mu.Lock()
		tr.bodies = append(tr.bodies, b)
		tr.mu.Unlock()
	}
	return resp, err
}

func (tr *tracker) CloseIdleConnections() {
	if c, ok := tr.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (tr *tracker) all() []*trackedBody {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]*trackedBody(nil), tr.bodies...)
}

// requestBody is a request body that records whether it was closed.
type requestBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *requestBody) Close() error { b.closed.Store(true); return nil }

// logs collects log records at every level, as "LEVEL message".
type logs struct {
	mu      sync.Mutex
	msgs    []string
	waiters map[string][]chan struct{} // by message; see await
}

func (l *logs) logger() *slog.Logger { return slog.New(l) }

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	msg := r.Level.String() + " " + r.Message
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, msg)
	for _, ch := range l.waiters[msg] {
		close(ch)
	}
	delete(l.waiters, msg)
	return nil
}

// await returns a channel that is closed once msg ("LEVEL message") is
// logged, by the logging goroutine before its log call returns; at once if
// it already was.
func (l *logs) await(msg string) <-chan struct{} {
	ch := make(chan struct{})
	l.mu.Lock()
	defer l.mu.Unlock()
	if contains(l.msgs, msg) {
		close(ch)
		return ch
	}
	if l.waiters == nil {
		l.waiters = make(map[string][]chan struct{})
	}
	l.waiters[msg] = append(l.waiters[msg], ch)
	return ch
}

func (l *logs) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// countingStore counts the calls a Throttler makes to its store.
type countingStore struct {
	*throttle.MemoryStore
	reserves, pauses, cancels atomic.Int64
}

func (s *countingStore) Reserve(ctx context.Context, target string, lim throttle.Limit, reqs []throttle.Request, grants []throttle.Grant) (throttle.State, error) {
	s.reserves.Add(1)
	return s.MemoryStore.Reserve(ctx, target, lim, reqs, grants)
}

func (s *countingStore) Pause(ctx context.Context, target string, d time.Duration) (time.Duration, error) {
	s.pauses.Add(1)
	return s.MemoryStore.Pause(ctx, target, d)
}

func (s *countingStore) Cancel(ctx context.Context, target string, id uint64, n int) error {
	s.cancels.Add(1)
	return s.MemoryStore.Cancel(ctx, target, id, n)
}
