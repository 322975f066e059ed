package throttle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// scriptCounter counts script calls (EVALSHA and EVAL) through a client.
type scriptCounter struct{ n atomic.Int64 }

func (c *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// peak returns the most times in any interval [t, t+window).
func peak(times []time.Time, window time.Duration) int {
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	best, j := 0, 0
	for i := range times {
		for times[i].Sub(times[j]) >= window {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestFleetProperty runs 3 independent clients × 8 goroutines on one target
// against a real Redis for a few seconds and checks the guarantee on the
// server's clock: at most N admissions in any window, a steady rate of at
// least 95% of N/(W+margin), at most 1.05 store calls per admission, and no
// key left once its TTL has passed.
func TestFleetProperty(t *testing.T) {
	srv := redistest.StartServer(t)
	prefix := redistest.KeyPrefix(t)
	// The 24 waiters fit within one window's bookings, the default horizon,
	// so each admission needs one booking; deeper queues pay one more call
	// for the waiters beyond the horizon (see WithMaxAhead).
	const (
		limit  = 30
		window = 500 * time.Millisecond
		margin = 50 * time.Millisecond
	)
	rules, err := ParseRules("*=30/500ms")
	require.NoError(t, err)
	timeClient := srv.Client(t)
	var calls scriptCounter
	var throttlers []*Throttler
	for range 3 {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr})
		client.AddHook(&calls)
		t.Cleanup(func() { client.Close() })
		s, err := NewRedisStore(client, WithKeyPrefix(prefix), WithLiveness(window))
		require.NoError(t, err)
		tr, err := New(rules, WithStore(s), WithMargin(margin), WithStoreTimeout(time.Second), WithLogger(quietLogger()))
		require.NoError(t, err)
		t.Cleanup(func() { tr.Close() })
		throttlers = append(throttlers, tr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var mu sync.Mutex
	var admitted []time.Time
	var wg sync.WaitGroup
	for _, tr := range throttlers {
		for range 8 {
			wg.Go(func() {
				for {
					if err := tr.Wait(ctx, "fleet.example"); err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("Wait: %v", err)
						}
						return
					}
					now, err := timeClient.Time(context.Background()).Result()
					if err != nil {
						t.Errorf("TIME: %v", err)
						return
					}
					mu.Lock()
					admitted = append(admitted, now)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()

	require.LessOrEqual(t, peak(admitted, window), limit, "admissions in one window, on the server's clock")
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].Before(admitted[j]) })
	span := admitted[len(admitted)-1].Sub(admitted[0])
	steady := float64(len(admitted)-limit) / span.Seconds()
	ideal := limit / (window + margin).Seconds()
	t.Logf("%d admissions in %v: %.1f/s steady, ideal %.1f/s; %d script calls (%.3f per admission)",
		len(admitted), span, steady, ideal, calls.n.Load(), float64(calls.n.Load())/float64(len(admitted)))
	require.GreaterOrEqual(t, steady, 0.95*ideal, "steady-state rate")
	require.LessOrEqual(t, float64(calls.n.Load())/float64(len(admitted)), 1.05, "store calls per admission")

	// Every key is gone once its TTL has passed: the log after its last
	// window, the heartbeat after its liveness (2 × 550 ms here).
	require.Eventually(t, func() bool {
		keys, err := timeClient.Keys(context.Background(), prefix+"*").Result()
		return err == nil && len(keys) == 0
	}, 3*time.Second, 100*time.Millisecond, "keys left behind")
}

// TestFleetSurvivesRedisRestart kills Redis under a running fleet and brings
// it back empty: with FailLocal, the target still never sees more than N in
// any window, and the fleet keeps admitting during the outage and after.
func TestFleetSurvivesRedisRestart(t *testing.T) {
	srv := redistest.StartServer(t)
	prefix := redistest.KeyPrefix(t)
	const (
		limit  = 12
		window = 500 * time.Millisecond
	)
	rules, err := ParseRules("*=12/500ms")
	require.NoError(t, err)
	var throttlers []*Throttler
	for range 3 {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
		t.Cleanup(func() { client.Close() })
		s, err := NewRedisStore(client, WithKeyPrefix(prefix))
		require.NoError(t, err)
		tr, err := New(rules, WithStore(s), WithMargin(20*time.Millisecond), WithRecoveryGrace(300*time.Millisecond), WithLogger(quietLogger()))
		require.NoError(t, err)
		t.Cleanup(func() { tr.Close() })
		throttlers = append(throttlers, tr)
	}

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	var admitted []time.Time
	var wg sync.WaitGroup
	for _, tr := range throttlers {
		for range 4 {
			wg.Go(func() {
				for tr.Wait(ctx, "fleet.example") == nil {
					mu.Lock()
					admitted = append(admitted, time.Now())
					mu.Unlock()
				}
			})
		}
	}
	var sawFallback atomic.Bool
	wg.Go(func() {
		time.Sleep(time.Second)
		srv.Kill(t)
		time.Sleep(time.Second)
		sawFallback.Store(throttlers[0].Mode() == ModeFallback)
		time.Sleep(1500 * time.Millisecond)
		srv.Restart(t)
	})
	wg.Wait()

	count := func(from, to time.Duration) (n int) {
		for _, a := range admitted {
			if d := a.Sub(start); d >= from && d < to {
				n++
			}
		}
		return n
	}
	t.Logf("admitted: %d before the kill, %d during the outage, %d after the restart",
		count(0, time.Second), count(time.Second, 3500*time.Millisecond), count(3500*time.Millisecond, 5*time.Second))
	require.True(t, sawFallback.Load(), "the throttler must report its fallback")
	require.LessOrEqual(t, peak(admitted, window), limit, "admissions in one window across the failure and the recovery")
	require.Positive(t, count(2*time.Second, 3500*time.Millisecond), "the local fallback admits during a long outage")
	require.Positive(t, count(4*time.Second, 5*time.Second), "the fleet admits again after the restart")
	require.Equal(t, ModeStore, throttlers[0].Mode())
}
