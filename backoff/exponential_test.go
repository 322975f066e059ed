package backoff_test

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/backoff"
)

func TestExponentialNoJitter(t *testing.T) {
	tests := []struct {
		name  string
		e     backoff.Exponential
		retry int
		want  time.Duration
	}{
		{"defaults first retry", backoff.Exponential{}, 0, 100 * time.Millisecond},
		{"defaults double", backoff.Exponential{}, 3, 800 * time.Millisecond},
		{"defaults capped at 30s", backoff.Exponential{}, 9, 30 * time.Second},
		{"negative retry counts as 0", backoff.Exponential{}, -5, 100 * time.Millisecond},
		{"custom base and multiplier", backoff.Exponential{Base: time.Second, Multiplier: 3}, 2, 9 * time.Second},
		{"custom max", backoff.Exponential{Max: time.Second}, 5, time.Second},
		{"multiplier below 1 is constant", backoff.Exponential{Multiplier: 0.5}, 7, 100 * time.Millisecond},
		{"NaN multiplier is constant", backoff.Exponential{Multiplier: math.NaN()}, 7, 100 * time.Millisecond},
		{"infinite multiplier hits max", backoff.Exponential{Multiplier: math.Inf(1)}, 1, 30 * time.Second},
		{"base above max is max", backoff.Exponential{Base: time.Minute}, 0, 30 * time.Second},
		{"huge retry is max", backoff.Exponential{}, 10000, 30 * time.Second},
		{"max int retry is max", backoff.Exponential{}, math.MaxInt, 30 * time.Second},
		{"no overflow at the largest max", backoff.Exponential{Max: math.MaxInt64}, 10000, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.e.Jitter = backoff.NoJitter
			require.Equal(t, tt.want, tt.e.Delay(tt.retry, 0))
		})
	}
}

// TestExponentialBounds draws 1000 delays per case and checks each lies in
// [lo, hi].
func TestExponentialBounds(t *testing.T) {
	const base, limit = 100 * time.Millisecond, 30 * time.Second
	tests := []struct {
		name   string
		jitter backoff.Jitter
		retry  int
		prev   time.Duration
		lo, hi time.Duration
	}{
		{"full first", backoff.FullJitter, 0, 0, 0, base},
		{"full fourth", backoff.FullJitter, 3, 0, 0, 8 * base},
		{"full huge retry", backoff.FullJitter, 10000, 0, 0, limit},
		{"unknown jitter is full", backoff.Jitter(42), 3, 0, 0, 8 * base},
		{"equal first", backoff.EqualJitter, 0, 0, base / 2, base},
		{"equal fourth", backoff.EqualJitter, 3, 0, 4 * base, 8 * base},
		{"equal huge retry", backoff.EqualJitter, 10000, 0, limit / 2, limit},
		{"decorrelated first", backoff.DecorrelatedJitter, 0, 0, base, 3 * base},
		{"decorrelated grows from prev", backoff.DecorrelatedJitter, 0, time.Second, base, 3 * time.Second},
		{"decorrelated capped", backoff.DecorrelatedJitter, 0, 20 * time.Second, base, limit},
		{"decorrelated huge prev", backoff.DecorrelatedJitter, 0, math.MaxInt64, base, limit},
		{"decorrelated negative prev", backoff.DecorrelatedJitter, 0, -time.Hour, base, 3 * base},
		{"none", backoff.NoJitter, 3, 0, 8 * base, 8 * base},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := backoff.Exponential{Jitter: tt.jitter, Rand: rand.New(rand.NewPCG(1, 2))}
			for range 1000 {
				d := e.Delay(tt.retry, tt.prev)
				require.GreaterOrEqual(t, d, tt.lo)
				require.LessOrEqual(t, d, tt.hi)
			}
		})
	}
}

// TestExponentialDecorrelatedChain feeds each delay back as prev, as a
// caller does, and checks the chain stays within [Base, Max].
func TestExponentialDecorrelatedChain(t *testing.T) {
	e := backoff.Exponential{Jitter: backoff.DecorrelatedJitter, Max: 5 * time.Second, Rand: rand.New(rand.NewPCG(1, 2))}
	var prev time.Duration
	for retry := range 1000 {
		d := e.Delay(retry, prev)
		require.GreaterOrEqual(t, d, 100*time.Millisecond)
		require.LessOrEqual(t, d, 5*time.Second)
		prev = d
	}
}

func TestExponentialDeterministic(t *testing.T) {
	for _, jitter := range []backoff.Jitter{backoff.FullJitter, backoff.EqualJitter, backoff.DecorrelatedJitter} {
		t.Run(strconvJitter(jitter), func(t *testing.T) {
			draw := func() []time.Duration {
				e := backoff.Exponential{Jitter: jitter, Rand: rand.New(rand.NewPCG(1, 2))}
				var got []time.Duration
				var prev time.Duration
				for retry := range 20 {
					prev = e.Delay(retry, prev)
					got = append(got, prev)
				}
				return got
			}
			want := draw()
			require.Equal(t, want, draw())
		})
	}
}

func strconvJitter(j backoff.Jitter) string {
	return [...]string{"full", "equal", "decorrelated", "none"}[j]
}

// TestExponentialConcurrent shares one seeded Rand between two
// Exponentials used from many goroutines; run it with -race.
func TestExponentialConcurrent(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	es := []*backoff.Exponential{
		{Rand: r},
		{Rand: r, Jitter: backoff.DecorrelatedJitter},
		{}, // global source
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			e := es[i%len(es)]
			var prev time.Duration
			for retry := range 500 {
				prev = e.Delay(retry, prev)
				if prev < 0 || prev > 30*time.Second {
					t.Errorf("Delay(%d) = %v, outside [0, 30s]", retry, prev)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkExponentialDelay(b *testing.B) {
	b.ReportAllocs()
	e := backoff.Exponential{Rand: rand.New(rand.NewPCG(1, 2))}
	b.RunParallel(func(pb *testing.PB) {
		for retry := 0; pb.Next(); retry++ {
			e.Delay(retry%20, 0)
		}
	})
}
