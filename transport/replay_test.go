package transport_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

// resetting answers /reset by closing the connection with a reset after
// reading the request, and everything else with 200.
func resetting(t *testing.T) answer {
	return func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/reset" {
			w.WriteHeader(http.StatusOK)
			return
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		_ = conn.(*net.TCPConn).SetLinger(0) // close with RST
		_ = conn.Close()
	}
}

// net/http resends an idempotent request on another connection when a
// reused one fails before the response's first byte, and the target may
// have received the first: each such replay pays the quota too.
func TestReplaysOfTheBaseTransportPayTheQuota(t *testing.T) {
	for _, tc := range []struct {
		rule     string
		arrivals int  // the target's count: /ok, /reset, and the replay if it had a slot
		refused  bool // no slot for the replay before the deadline: not sent
	}{
		{"3/1h", 3, false},
		{"2/1h", 2, true},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			tg := newTarget(t, resetting(t))
			thr := newThrottler(t, tc.rule)
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			tr := transport.New(base, thr, transport.WithoutRetries())
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()

			req, err := http.NewRequestWithContext(ctx, http.MethodGet, tg.URL+"/ok", nil)
			require.NoError(t, err)
			resp, err := roundTrip(t, tr, req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close()) // the connection goes back to the pool

			req, err = http.NewRequestWithContext(ctx, http.MethodGet, tg.URL+"/reset", nil)
			require.NoError(t, err)
			_, err = roundTrip(t, tr, req) // sent on the reused connection, then replayed
			require.Error(t, err)
			if tc.refused {
				require.True(t, errors.Is(err, context.DeadlineExceeded), "want the quota's refusal, got %v", err)
				var te *transport.Error
				require.ErrorAs(t, err, &te)
			}

			require.Len(t, tg.seen(), tc.arrivals, "requests the target received")
			d, err := thr.Allow(ctx, tg.host)
			require.NoError(t, err)
			require.False(t, d.Allowed, "every request the target received was counted, so the quota is used up")
		})
	}
}

// A replay's wait on the quota is part of its attempt's reported wait.
func TestAReplaysWaitIsReported(t *testing.T) {
	tg := newTarget(t, resetting(t))
	thr := newThrottler(t, "2/300ms")
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	var a attempts
	tr := transport.New(base, thr, transport.WithoutRetries(), a.option())
	for _, path := range []string{"/ok", "/reset"} { // /reset goes on /ok's connection, then again on a new one
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, tg.URL+path, nil)
		require.NoError(t, err)
		if resp, err := roundTrip(t, tr, req); err == nil {
			require.NoError(t, resp.Body.Close())
		}
	}
	require.Len(t, tg.seen(), 3)
	infos := a.all()
	require.Len(t, infos, 2)
	require.Less(t, infos[0].Waited, 100*time.Millisecond, "/ok: a slot at once")
	require.GreaterOrEqual(t, infos[1].Waited, 250*time.Millisecond,
		"/reset: a slot at once, then its replay's, a window and the margin after /ok's")
}

// A connection that comes later than the margin allows after the slot (a
// slow dial, a TLS handshake, a wait for a free connection) books again
// before the request is written, so that the target never sees two
// requests closer than the rule allows.
func TestAConnectionLateForItsSlotBooksAgain(t *testing.T) {
	tg := newTarget(t, statuses(http.StatusOK))
	thr := newThrottler(t, "1/500ms") // and the default margin, 50ms
	const dialDelay = 200 * time.Millisecond
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		time.Sleep(dialDelay)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	t.Cleanup(base.CloseIdleConnections)
	tr := transport.New(base, thr, transport.WithoutRetries())
	for range 2 { // the second reuses the first's connection
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, tg.URL, nil)
		require.NoError(t, err)
		resp, err := roundTrip(t, tr, req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
	}
	seen := tg.seen()
	require.Len(t, seen, 2)
	require.GreaterOrEqual(t, seen[1].at.Sub(seen[0].at), 500*time.Millisecond,
		"the first request's slot is when it could be written, %v after it was booked", dialDelay)
}

// An HTTP/2 server that takes one stream at a time refuses the others,
// and net/http retries them itself, a second later from their second
// retry: those retries check their slot again, so the server never sees
// more than the rule allows.
func TestHTTP2RetriesOfRefusedStreamsKeepTheLimit(t *testing.T) {
	// The run lasts until the server has seen two windows' worth, so the
	// limit is tested past the stall and the retries it causes (about 3s),
	// or, on a machine too loaded for that, until the bound.
	const limit, window = 10, time.Second
	const enough, bound = 2 * limit, 30 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	var (
		mu       sync.Mutex
		arrivals []time.Time
		first    atomic.Bool
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		if len(arrivals) >= enough {
			cancel()
		}
		mu.Unlock()
		if first.CompareAndSwap(false, true) {
			time.Sleep(1500 * time.Millisecond) // holds the only stream
		}
	}))
	srv.EnableHTTP2 = true
	srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	// The margin is wider than the default: the server stamps an arrival
	// when its handler runs, and under -race on a loaded machine that came
	// 150 ms after a request passed its connection's check (1 run in 25).
	// The retries' back-off is a second, far past it: without the check at
	// the retry's connection the server sees 11 to 18 in a second.
	const margin = 250 * time.Millisecond
	thr := newThrottler(t, fmt.Sprintf("%d/%v", limit, window), throttle.WithMargin(margin))
	// A copy of the server client's TLS config: srv.Close sets that
	// client's defaults in it, while a dial of base's that the end of the
	// run left behind may still be reading it.
	tlsConfig := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	base := &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true}
	t.Cleanup(base.CloseIdleConnections)
	client := &http.Client{Transport: transport.New(base, thr)}
	start := time.Now()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(arrivals), enough, "arrivals in %v: the run must fill more than a window", time.Since(start).Round(time.Millisecond))
	peak, at := 0, time.Time{}
	for i, a := range arrivals {
		n := 0
		for _, b := range arrivals[i:] {
			if !b.Before(a) && b.Sub(a) < window {
				n++
			}
		}
		if n > peak {
			peak, at = n, a
		}
	}
	require.LessOrEqual(t, peak, limit, "requests the server saw in the second from %v", at.Sub(arrivals[0]))
}

// A response without a body (HEAD, 204) keeps http.NoBody, which callers
// may compare with.
func TestABodylessResponseKeepsNoBody(t *testing.T) {
	tg := newTarget(t, statuses(http.StatusNoContent))
	tr := transport.New(nil, newThrottler(t, "10/1s"))
	for _, method := range []string{http.MethodHead, http.MethodGet} {
		req, err := http.NewRequestWithContext(t.Context(), method, tg.URL, nil)
		require.NoError(t, err)
		resp, err := roundTrip(t, tr, req)
		require.NoError(t, err)
		require.Equal(t, http.NoBody, resp.Body, method)
		require.NoError(t, resp.Body.Close())
	}
}
