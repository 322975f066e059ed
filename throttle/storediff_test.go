package throttle

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// TestRedisStoreMatchesMemoryStore runs one random sequence of operations
// (bookings of one or several requests and units, cancellations of past and
// future bookings, restores out of slot order, pauses, small and large
// steps of the clock) on a MemoryStore and on a RedisStore, both on one
// fake clock, and requires the same grant for every request, the same
// state after every call, and the Redis log in slot order after every step.
// The limits are large enough for long logs: the script's trimming, its
// reads from either end of the log and its search for cancelled entries
// all take their longer paths. Each sequence runs with the script's own
// inline maximum, with every log in the list, and with logs that move
// between meta and the list at four entries.
func TestRedisStoreMatchesMemoryStore(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	ctx := context.Background()
	allMoves, allUncut := map[string]int{}, map[string]int{} // by inline maximum
	for _, lim := range []Limit{
		{Limit: 3, Window: 100 * time.Millisecond},
		{Limit: 7, Window: sec},
		{Limit: 40, Window: 500 * time.Millisecond, Gap: 5 * time.Millisecond},
		{Limit: 150, Window: 2 * sec},
	} {
		for _, inlineMax := range []string{"", "0", "4"} {
			t.Run(fmt.Sprintf("%d per %v gap %v inline %q", lim.Limit, lim.Window, lim.Gap, inlineMax), func(t *testing.T) {
				clock := newFakeClock()
				mem := NewMemoryStore(WithMemoryClock(clock.Time), WithSweepInterval(0))
				t.Cleanup(func() { mem.Close() })
				rs, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
				require.NoError(t, err)
				rs.now, rs.inlineMax = clock.us.Load, inlineMax
				stores := []Store{mem, rs}
				const target = "diff.example"

				type booking struct {
					id uint64
					n  int
				}
				var booked []booking
				var id uint64
				rng := rand.New(rand.NewPCG(7, uint64(lim.Limit)))
				w := lim.Window
				var longest, cancelled, restored, inline, moves, uncut int
				wasInline := false
				for step := range 600 {
					switch p := rng.IntN(100); {
					case p < 30:
						clock.Advance(time.Duration(rng.IntN(50)) * time.Millisecond)
					case p < 34:
						clock.Advance(time.Duration(rng.Int64N(int64(3 * w))))
					case p < 42 && len(booked) > 0:
						i := rng.IntN(len(booked))
						b := booked[i]
						booked = append(booked[:i], booked[i+1:]...)
						for _, s := range stores {
							require.NoError(t, s.Cancel(ctx, target, b.id, b.n), "step %d", step)
						}
						cancelled++
					case p < 46:
						var entries []Entry
						for range 1 + rng.IntN(3) {
							id++
							entries = append(entries, Entry{ID: id, N: 1 + rng.IntN(3), Age: time.Duration(rng.Int64N(int64(5*w/2))) - w})
						}
						for _, s := range stores {
							require.NoError(t, s.Restore(ctx, target, w, entries), "step %d", step)
						}
						restored++
					case p < 48:
						d := time.Duration(rng.Int64N(int64(w)))
						var left [2]time.Duration
						for i, s := range stores {
							left[i], err = s.Pause(ctx, target, d)
							require.NoError(t, err, "step %d", step)
						}
						require.Equal(t, left[0], left[1], "step %d: pause left", step)
					default:
						reqs := make([]Request, 1+rng.IntN(4))
						for i := range reqs {
							id++
							n := 1 + rng.IntN(3)
							if rng.IntN(20) == 0 {
								n = lim.Limit + rng.IntN(2) // the whole limit, or more than it
							}
							reqs[i] = Request{ID: id, N: n, MaxWait: []time.Duration{0, -1, time.Duration(rng.Int64N(int64(2 * w)))}[rng.IntN(3)]}
						}
						var grants [2][]Grant
						var states [2]State
						for i, s := range stores {
							grants[i] = make([]Grant, len(reqs))
							states[i], err = s.Reserve(ctx, target, lim, reqs, grants[i])
							require.NoError(t, err, "step %d", step)
							states[i].Live, states[i].Place, states[i].Joined = 0, 0, false // each store's own heartbeat
						}
						require.Equal(t, grants[0], grants[1], "step %d: grants of %+v", step, reqs)
						if states[1].Remaining != states[0].Remaining {
							// A list log counts the entries that expired since
							// its latest cut (at most a quarter window ago):
							// Redis's Remaining is then the memory store's
							// less those, never more. No other log does.
							require.NotEqual(t, "0", inlineMax, "step %d: remaining of a log that is always read from its head", step)
							require.Negative(t, readMeta(t, client, rs, target).inline, "step %d: remaining of an inline log", step)
							dead, _ := deadAndLive(t, client, rs, target, clock.us.Load()-w.Microseconds())
							require.Equal(t, max(0, states[0].Remaining-dead), states[1].Remaining, "step %d: remaining, %d dead entries in the log", step, dead)
							states[1].Remaining = states[0].Remaining
							uncut++
						}
						require.Equal(t, states[0], states[1], "step %d: state", step)
						for i, g := range grants[0] {
							if g.OK {
								booked = append(booked, booking{reqs[i].ID, reqs[i].N})
							}
						}
					}
					// The script relies on the log being in slot order.
					es := logOf(t, client, rs, target)
					isInline := readMeta(t, client, rs, target).inline >= 0
					if isInline {
						inline++
					}
					if isInline != wasInline {
						moves++
					}
					wasInline = isInline
					require.True(t, slices.IsSortedFunc(es, func(a, b string) int { return strings.Compare(a[:8], b[:8]) }), "step %d: the log is out of slot order", step)
					longest = max(longest, len(es))
				}
				t.Logf("longest log %d entries, %d cancellations, %d restores, %d steps with the log inline, %d moves between meta and the list, %d decisions counting uncut dead entries",
					longest, cancelled, restored, inline, moves, uncut)
				allUncut[inlineMax] += uncut
				if inlineMax == "0" {
					require.Zero(t, inline, "no log is kept inline")
				}
				allMoves[inlineMax] += moves
				require.Greater(t, longest, max(lim.Limit, 64), "the log must grow past the limit (reservations ahead) and past several search chunks")
			})
		}
	}
	for _, inlineMax := range []string{"", "4"} {
		require.GreaterOrEqual(t, allMoves[inlineMax], 10, "inline %q: logs must move between meta and the list, both ways, again and again", inlineMax)
		require.Positive(t, allUncut[inlineMax], "inline %q: some decisions must count dead entries left uncut", inlineMax)
	}
}

// TestProcessesSharingALogMatchTheMemoryStore: three RedisStores (processes,
// each with its own hints: the script reads a log from its tail, or from
// its length and last entry, by what the process's latest reply said) take
// turns at random on one target, with waits, units, cancels and clock
// steps, against one MemoryStore: every grant is the same, and Redis's
// Remaining is the memory store's, less the dead entries a list log still
// counts, never more. Limits of one unit with bookings far ahead, of a
// gap, of long logs, and of windows of a few milliseconds and microseconds.
func TestProcessesSharingALogMatchTheMemoryStore(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	ctx := context.Background()
	uncut := 0
	for seed := uint64(1); seed <= 6; seed++ {
		for _, lim := range []Limit{
			{Limit: 1, Window: 100 * time.Millisecond, Ahead: 8 * time.Second},
			{Limit: 80, Window: 500 * time.Millisecond, Gap: 2 * time.Millisecond},
			{Limit: 150, Window: 2 * sec},
			{Limit: 90, Window: 3 * time.Millisecond},
			{Limit: 70, Window: 3 * time.Microsecond},
		} {
			t.Run(fmt.Sprintf("seed %d, %d per %v", seed, lim.Limit, lim.Window), func(t *testing.T) {
				clock := newFakeClock()
				mem := NewMemoryStore(WithMemoryClock(clock.Time), WithSweepInterval(0))
				t.Cleanup(func() { mem.Close() })
				prefix := redistest.KeyPrefix(t)
				var procs []*RedisStore
				for range 3 {
					s, err := NewRedisStore(client, WithKeyPrefix(prefix))
					require.NoError(t, err)
					s.now = clock.us.Load
					procs = append(procs, s)
				}
				rng := rand.New(rand.NewPCG(seed, uint64(lim.Limit)))
				type booking struct {
					id      uint64
					n, proc int
				}
				var booked []booking
				w := lim.Window
				const target = "x.example"
				for step := range 500 {
					switch p := rng.IntN(100); {
					case p < 30:
						clock.Advance(time.Duration(rng.Int64N(int64(w / 3))))
					case p < 33:
						clock.Advance(time.Duration(rng.Int64N(int64(3 * w))))
					case p < 38 && len(booked) > 0:
						i := rng.IntN(len(booked))
						b := booked[i]
						booked = append(booked[:i], booked[i+1:]...)
						require.NoError(t, mem.Cancel(ctx, target, b.id, b.n))
						require.NoError(t, procs[b.proc].Cancel(ctx, target, b.id, b.n))
					default:
						reqs := make([]Request, 1+rng.IntN(6))
						for i := range reqs {
							reqs[i] = Request{ID: nextID(), N: 1 + rng.IntN(min(3, lim.Limit)), MaxWait: []time.Duration{0, -1, time.Duration(rng.Int64N(int64(2 * w)))}[rng.IntN(3)]}
						}
						want, got := make([]Grant, len(reqs)), make([]Grant, len(reqs))
						memState, err := mem.Reserve(ctx, target, lim, reqs, want)
						require.NoError(t, err)
						pi := rng.IntN(len(procs))
						st, err := procs[pi].Reserve(ctx, target, lim, reqs, got)
						require.NoError(t, err)
						require.Equal(t, want, got, "step %d: grants of %+v", step, reqs)
						require.False(t, st.Lost, "step %d", step)
						if st.Remaining != memState.Remaining {
							require.Negative(t, readMeta(t, client, procs[pi], target).inline, "step %d: remaining of an inline log", step)
							dead, _ := deadAndLive(t, client, procs[pi], target, clock.us.Load()-w.Microseconds())
							require.Equal(t, max(0, memState.Remaining-dead), st.Remaining, "step %d: remaining, %d dead entries in the log", step, dead)
							uncut++
						}
						for i, g := range want {
							if g.OK {
								booked = append(booked, booking{reqs[i].ID, reqs[i].N, pi})
							}
						}
					}
				}
			})
		}
	}
	t.Logf("%d decisions counted uncut dead entries", uncut)
	require.Positive(t, uncut, "some decisions must count dead entries left uncut")
}

// deadAndLive counts the entries of s's log for target whose slots are at
// or before cutoff (µs), and those after it.
func deadAndLive(t *testing.T, client redis.UniversalClient, s *RedisStore, target string, cutoff int64) (dead, live int) {
	t.Helper()
	for _, e := range logOf(t, client, s, target) {
		if int64(binary.BigEndian.Uint64([]byte(e[:8]))) <= cutoff {
			dead++
		} else {
			live++
		}
	}
	return dead, live
}
