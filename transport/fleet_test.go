package transport_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

// Three processes, each with its own Redis client and Throttler, crawl one
// target. One of them hears a 429 with Retry-After: 2: the whole fleet must
// hold back for two seconds, then resume at the rule's rate.
func TestFleetWidePause(t *testing.T) {
	t.Parallel()
	const (
		processes  = 3
		workers    = 3 // goroutines per process, each with its own Transport
		warmUp     = 400 * time.Millisecond
		retryAfter = 2 * time.Second
		after      = 1500 * time.Millisecond // observed once the pause is over
	)
	srv := redistest.StartServer(t)
	prefix := redistest.KeyPrefix(t)

	var (
		mu       sync.Mutex
		first    time.Time
		sent429  time.Time
		arrivals []time.Time
	)
	got429 := make(chan struct{})
	tg := newTarget(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		arrivals = append(arrivals, now)
		if first.IsZero() {
			first = now
		}
		if sent429.IsZero() && now.Sub(first) >= warmUp {
			sent429 = time.Now()
			close(got429)
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})

	// 10 per 500ms, spread by the gap, so the fleet sends one request
	// every 50ms: the rate resumed after the pause is measurable.
	rules, err := throttle.ParseRules("*=10/500ms,gap=50ms")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var wg sync.WaitGroup
	for range processes {
		store, err := throttle.NewRedisStore(srv.Client(t), throttle.WithKeyPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		thr, err := throttle.New(rules, throttle.WithStore(store), throttle.WithStoreTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = thr.Close() })
		for range workers {
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			client := &http.Client{Transport: transport.New(base, thr)}
			wg.Go(func() {
				for ctx.Err() == nil {
					req, err := http.NewRequestWithContext(ctx, http.MethodGet, tg.URL, nil)
					if err != nil {
						t.Error(err)
						return
					}
					resp, err := client.Do(req)
					if err != nil {
						if !errors.Is(err, context.Canceled) {
							t.Errorf("worker: %v", err)
						}
						return
					}
					_ = resp.Body.Close()
				}
			})
		}
	}

	select {
	case <-got429:
	case <-time.After(5 * time.Second):
		t.Fatal("the target never answered 429")
	}
	time.Sleep(time.Until(sent429.Add(retryAfter + after)))
	stop()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	var during, resumed int
	for _, at := range arrivals {
		switch d := at.Sub(sent429); {
		case d > 0 && d < retryAfter:
			during++
		case d >= retryAfter && d <= retryAfter+after:
			resumed++
		}
	}
	// Only requests already past their pause check when the 429 was sent,
	// at most one per process, may arrive during the pause.
	if during > processes {
		t.Errorf("%d requests arrived during the 2s pause, want at most %d", during, processes)
	}
	// 1.5s at 10 per 500ms is up to 30 (plus the window already open);
	// well under that means the fleet did not resume.
	if resumed < 15 || resumed > 40 {
		t.Errorf("%d requests arrived in the 1.5s after the pause, want about 30", resumed)
	}
	t.Logf("arrivals: %d before the 429, %d during the pause, %d in the %v after it", len(arrivals)-during-resumed, during, resumed, after)
}
