package transport_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/backoff"
	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

func TestRetryAfterPausesTheFleet(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(429)
		}
	})
	thr := newThrottler(t, "100/1s")
	var rec attempts
	rt := transport.New(nil, thr, transport.WithoutRetries(), rec.option())

	resp, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
	if err != nil {
		t.Fatal(err)
	}
	require.Equal(t, 429, resp.StatusCode, "status")
	left, err := thr.Paused(t.Context(), tg.host)
	if err != nil {
		t.Fatal(err)
	}
	between(t, 800*time.Millisecond, time.Second, left, "pause left")
	require.Equal(t, time.Second, rec.all()[0].Pause, "pause reported")

	// A request that cannot wait a second fails at once, unsent.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := roundTrip(t, rt, get(t, ctx, tg.URL)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want context.DeadlineExceeded, got %v", err)
	}
	// One that can waits the pause out.
	resp, err = roundTrip(t, rt, get(t, t.Context(), tg.URL))
	if err != nil {
		t.Fatal(err)
	}
	require.Equal(t, 200, resp.StatusCode, "status after the pause")
	a := tg.seen()
	require.Equal(t, 2, len(a), "arrivals")
	between(t, 950*time.Millisecond, 1500*time.Millisecond, a[1].at.Sub(a[0].at), "second arrival after the 429")
}

func TestRetryAfterValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		status     int
		retryAfter string
		opts       []transport.Option
		thrOpts    []throttle.Option
		lo, hi     time.Duration // the pause left
		wantLog    string
		notLog     string // a line that must not be logged
	}{
		{name: "seconds", status: 503, retryAfter: "3", lo: 2800 * time.Millisecond, hi: 3 * time.Second},
		{name: "HTTP-date", status: 429, retryAfter: "{date in 10s}", lo: 8 * time.Second, hi: 10 * time.Second},
		{name: "absurd, default cap", status: 429, retryAfter: "999999999", lo: transport.DefaultMaxRetryAfter - time.Second, hi: transport.DefaultMaxRetryAfter, wantLog: "WARN fleetgate: Retry-After capped"},
		{name: "absurd, transport cap", status: 503, retryAfter: "999999999", opts: []transport.Option{transport.WithMaxRetryAfter(2 * time.Second)}, lo: 1800 * time.Millisecond, hi: 2 * time.Second, wantLog: "WARN fleetgate: Retry-After capped"},
		{name: "exactly the cap: not cut", status: 503, retryAfter: "2", opts: []transport.Option{transport.WithMaxRetryAfter(2 * time.Second)}, lo: 1800 * time.Millisecond, hi: 2 * time.Second, notLog: "WARN fleetgate: Retry-After capped"},
		{name: "throttler cap", status: 429, retryAfter: "60", thrOpts: []throttle.Option{throttle.WithMaxPause(time.Second)}, lo: 800 * time.Millisecond, hi: time.Second},
		{name: "zero", status: 503, retryAfter: "0"},
		{name: "garbage", status: 503, retryAfter: "soon", wantLog: "DEBUG fleetgate: ignoring Retry-After"},
		{name: "negative", status: 503, retryAfter: "-5", wantLog: "DEBUG fleetgate: ignoring Retry-After"},
		{name: "fraction", status: 503, retryAfter: "1.5", wantLog: "DEBUG fleetgate: ignoring Retry-After"},
		{name: "too many seconds to count: the cap", status: 503, retryAfter: "99999999999999999999", lo: transport.DefaultMaxRetryAfter - time.Second, hi: transport.DefaultMaxRetryAfter, wantLog: "WARN fleetgate: Retry-After capped"},
		// The server's clock is 5 s behind this one; its date is 10 s ahead of its clock.
		{name: "HTTP-date against the server's Date", status: 429, retryAfter: "{date in 10s, Date 5s behind}", lo: 8 * time.Second, hi: 11 * time.Second},
		// A 429 whose Retry-After is unusable is a 429 without one.
		{name: "garbage on a 429", status: 429, retryAfter: "soon", lo: transport.DefaultFirstPause/2 - 200*time.Millisecond, hi: transport.DefaultFirstPause, wantLog: "DEBUG fleetgate: ignoring Retry-After"},
		// Several field lines ask for them all: the longest; one bad line
		// spoils the field.
		{name: "two lines", status: 503, retryAfter: "1\n3", lo: 2800 * time.Millisecond, hi: 3 * time.Second},
		{name: "a bad line among two", status: 503, retryAfter: "3\nsoon", wantLog: "DEBUG fleetgate: ignoring Retry-After"},
		// Only 429 and 503 say when to come back.
		{name: "on a 500", status: 500, retryAfter: "3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tg := newTarget(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				if tt.retryAfter == "{date in 10s, Date 5s behind}" {
					w.Header().Set("Date", expand("{5s behind}"))
				}
				for _, line := range strings.Split(tt.retryAfter, "\n") {
					w.Header().Add("Retry-After", expand(line))
				}
				w.WriteHeader(tt.status)
			})
			thr := newThrottler(t, "100/1s", tt.thrOpts...)
			var l logs
			opts := append([]transport.Option{transport.WithoutRetries(), transport.WithLogger(l.logger())}, tt.opts...)
			rt := transport.New(nil, thr, opts...)

			resp, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
			if err != nil {
				t.Fatal(err)
			}
			require.Equal(t, tt.status, resp.StatusCode, "status")
			left, err := thr.Paused(t.Context(), tg.host)
			if err != nil {
				t.Fatal(err)
			}
			between(t, tt.lo, tt.hi, left, "pause left")
			if tt.wantLog != "" && !contains(l.all(), tt.wantLog) {
				t.Fatalf("want log %q, got %q", tt.wantLog, l.all())
			}
			if tt.notLog != "" && contains(l.all(), tt.notLog) {
				t.Fatalf("want no log %q, got %q", tt.notLog, l.all())
			}
		})
	}
}

// TestACappedPauseNamesItsTarget: a pause holds the throttle's target, not
// the host and port that asked for it, so the transport's lines name both,
// and another port of the same host is held too.
func TestACappedPauseNamesItsTarget(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "999999999")
		w.WriteHeader(429)
	})
	other := newTarget(t, func(int, http.ResponseWriter, *http.Request) {})
	thr := newThrottler(t, "100/1s")
	var (
		mu  sync.Mutex
		buf bytes.Buffer
	)
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	rt := transport.New(nil, thr, transport.WithoutRetries(), transport.WithLogger(logger),
		transport.WithMaxRetryAfter(2*time.Second))
	if _, err := roundTrip(t, rt, get(t, t.Context(), tg.URL)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	line := buf.String()
	mu.Unlock()
	require.Contains(t, line, "Retry-After capped")
	require.Contains(t, line, " target=127.0.0.1 host="+tg.host+" ", "the target first, then the URL's host")
	left, err := thr.Paused(t.Context(), other.host)
	require.NoError(t, err)
	between(t, 1800*time.Millisecond, 2*time.Second, left, "pause on another port")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestTooManyRequestsWithoutRetryAfterEscalates(t *testing.T) {
	t.Parallel()
	codes := []int{429, 429, 429, 200, 429}
	tg := newTarget(t, statuses(codes...))
	thr := newThrottler(t, "100/1s")
	base := 40 * time.Millisecond
	rt := transport.New(nil, thr, transport.WithoutRetries(),
		transport.WithPauseBackoff(&backoff.Exponential{Base: base, Jitter: backoff.NoJitter}))

	want := []time.Duration{base, 2 * base, 4 * base, 0, base} // the run ends at the 200
	for i, code := range codes {
		resp, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
		if err != nil {
			t.Fatal(err)
		}
		require.Equal(t, code, resp.StatusCode, "status")
		left, err := thr.Paused(t.Context(), tg.host)
		if err != nil {
			t.Fatal(err)
		}
		between(t, max(0, want[i]-25*time.Millisecond), want[i], left, "pause after response "+strconv.Itoa(i))
	}
}

func TestConcurrentTooManyRequestsEscalateOnce(t *testing.T) {
	t.Parallel()
	const n = 5
	var arrived sync.WaitGroup
	arrived.Add(n)
	tg := newTarget(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		arrived.Done()
		arrived.Wait() // all n are in flight together
		w.WriteHeader(429)
	})
	var rec attempts
	rt := transport.New(nil, newThrottler(t, "100/1s"), transport.WithoutRetries(), rec.option(),
		transport.WithPauseBackoff(&backoff.Exponential{Base: 50 * time.Millisecond, Jitter: backoff.NoJitter}))
	var wg sync.WaitGroup
	for range n {
		req := get(t, t.Context(), tg.URL)
		wg.Go(func() { sendAsync(t, rt, req) })
	}
	wg.Wait()
	var pauses []time.Duration
	for _, i := range rec.all() {
		if i.Pause > 0 {
			pauses = append(pauses, i.Pause)
		}
	}
	require.Equal(t, []time.Duration{50 * time.Millisecond}, pauses, "pauses asked for")
}

// TestA429AfterAWaitAtTheConnectionEscalates: a request whose connection
// came after an escalation waits out that pause at the connection and is
// sent after it: its 429 is news, and escalates the run, where a 429 to a
// request already in flight at the escalation does not.
func TestA429AfterAWaitAtTheConnectionEscalates(t *testing.T) {
	t.Parallel()
	tg := newTarget(t, statuses(429))
	type slowKey struct{}
	dialing, escalated := make(chan struct{}), make(chan struct{})
	var once sync.Once
	base := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if ctx.Value(slowKey{}) != nil {
			close(dialing)                    // its slot is booked, before the first 429
			<-escalated                       // the connection comes after the first 429's pause began
			time.Sleep(3 * throttle.MinStale) // and too late for the slot
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	t.Cleanup(base.CloseIdleConnections)
	var mu sync.Mutex
	var pauses []time.Duration
	const first = 100 * time.Millisecond
	rt := transport.New(base, newThrottler(t, "100/1s"), transport.WithoutRetries(),
		transport.WithPauseBackoff(&backoff.Exponential{Base: first, Jitter: backoff.NoJitter}),
		transport.OnAttempt(func(a transport.AttemptInfo) {
			mu.Lock()
			pauses = append(pauses, a.Pause)
			mu.Unlock()
			if a.Pause > 0 {
				once.Do(func() { close(escalated) })
			}
		}))
	slow := get(t, context.WithValue(t.Context(), slowKey{}, true), tg.URL)
	var wg sync.WaitGroup
	wg.Go(func() { sendAsync(t, rt, slow) })
	<-dialing
	sendAsync(t, rt, get(t, t.Context(), tg.URL))
	wg.Wait()
	require.Equal(t, []time.Duration{first, 2 * first}, pauses, "the pauses the two 429s asked for")
	a := tg.seen()
	require.Len(t, a, 2)
	require.GreaterOrEqual(t, a[1].at.Sub(a[0].at), first, "the second request was sent after the first pause")
}

func TestRateLimitFields(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		header  map[string]string
		opts    []transport.Option
		lo, hi  time.Duration
		wantLog string
	}{
		{name: "none remaining", header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2"}, lo: 1800 * time.Millisecond, hi: 2 * time.Second},
		{name: "none remaining, reset as Unix time", header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "{unix in 3s}"}, lo: 1500 * time.Millisecond, hi: 3 * time.Second},
		{name: "reset as Unix time, against the server's Date", header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "{unix in 3s}", "Date": "{5s behind}"}, lo: 6500 * time.Millisecond, hi: 9 * time.Second},
		{name: "IETF fields", header: map[string]string{"RateLimit": `"default";r=0;t=2`, "RateLimit-Policy": `"default";q=10;w=60`}, lo: 1800 * time.Millisecond, hi: 2 * time.Second},
		{name: "some remaining", header: map[string]string{"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "2"}},
		{name: "reset capped", header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "3600"}, opts: []transport.Option{transport.WithMaxRetryAfter(time.Second)}, lo: 800 * time.Millisecond, hi: time.Second},
		{name: "reset beyond a day", header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "999999"}, wantLog: "DEBUG fleetgate: no requests remaining but no usable reset; not pausing"},
		{name: "garbage reset", header: map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "later"}, wantLog: "DEBUG fleetgate: no requests remaining but no usable reset; not pausing"},
		{name: "garbage remaining", header: map[string]string{"X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "2"}, wantLog: "DEBUG fleetgate: ignoring unusable rate-limit fields"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tg := newTarget(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				for k, v := range tt.header {
					w.Header().Set(k, expand(v))
				}
			})
			thr := newThrottler(t, "100/1s")
			var l logs
			opts := append([]transport.Option{transport.WithLogger(l.logger())}, tt.opts...)
			rt := transport.New(nil, thr, opts...)

			resp, err := roundTrip(t, rt, get(t, t.Context(), tg.URL))
			if err != nil {
				t.Fatal(err)
			}
			require.Equal(t, 200, resp.StatusCode, "status")
			left, err := thr.Paused(t.Context(), tg.host)
			if err != nil {
				t.Fatal(err)
			}
			between(t, tt.lo, tt.hi, left, "pause left")
			if tt.wantLog != "" && !contains(l.all(), tt.wantLog) {
				t.Fatalf("want log %q, got %q", tt.wantLog, l.all())
			}
		})
	}
}

// expand fills in the times that must be computed when the response is
// written, not when the test table is built.
func expand(v string) string {
	switch v {
	case "{date in 10s}":
		return time.Now().Add(10 * time.Second).UTC().Format(http.TimeFormat)
	case "{date in 10s, Date 5s behind}": // 5 s ahead of this clock
		return time.Now().Add(5 * time.Second).UTC().Format(http.TimeFormat)
	case "{5s behind}":
		return time.Now().Add(-5 * time.Second).UTC().Format(http.TimeFormat)
	case "{unix in 3s}":
		return strconv.FormatInt(time.Now().Add(3*time.Second).Unix(), 10)
	}
	return v
}

func contains(msgs []string, want string) bool {
	for _, m := range msgs {
		if m == want {
			return true
		}
	}
	return false
}
