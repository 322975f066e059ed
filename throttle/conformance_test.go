package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// fakeClock is a store clock the test moves by hand, in microseconds.
type fakeClock struct{ us atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.us.Store(1_700_000_000_000_000)
	return c
}

func (c *fakeClock) Advance(d time.Duration) { c.us.Add(d.Microseconds()) }
func (c *fakeClock) Time() time.Time         { return time.UnixMicro(c.us.Load()) }

// storeKind makes a fresh, empty store driven by a fake clock.
type storeKind struct {
	name string
	new  func(t *testing.T) (Store, *fakeClock)
}

func storeKinds(t *testing.T) []storeKind {
	single := redistest.StartServer(t)
	cluster := redistest.StartCluster(t)
	// inlineMax: how many entries a log keeps in meta ("": the script's
	// own figure; "0": every log is the list; a few: logs move between the
	// two all the time).
	redisKind := func(client func(t *testing.T) redis.UniversalClient, inlineMax string) func(t *testing.T) (Store, *fakeClock) {
		return func(t *testing.T) (Store, *fakeClock) {
			clock := newFakeClock()
			s, err := NewRedisStore(client(t), WithKeyPrefix(redistest.KeyPrefix(t)))
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() }) // on a Cluster: its epoch keys' upkeep
			s.now, s.inlineMax = clock.us.Load, inlineMax
			return s, clock
		}
	}
	return []storeKind{
		{"memory", func(t *testing.T) (Store, *fakeClock) {
			clock := newFakeClock()
			s := NewMemoryStore(WithMemoryClock(clock.Time))
			t.Cleanup(func() { s.Close() })
			return s, clock
		}},
		{"redis", redisKind(func(t *testing.T) redis.UniversalClient { return single.Client(t) }, "")},
		{"redis/list", redisKind(func(t *testing.T) redis.UniversalClient { return single.Client(t) }, "0")},
		{"redis/inline-2", redisKind(func(t *testing.T) redis.UniversalClient { return single.Client(t) }, "2")},
		{"cluster", redisKind(func(t *testing.T) redis.UniversalClient { return cluster.Client(t) }, "")},
	}
}

// storeCase is one semantic case every store must pass.
type storeCase struct {
	name string
	run  func(t *testing.T, h *harness)
}

type harness struct {
	s      Store
	clock  *fakeClock
	target string
	id     uint64
}

func (h *harness) reserve(t *testing.T, lim Limit, n int, maxWait time.Duration) (Grant, State, uint64) {
	t.Helper()
	h.id++
	var g [1]Grant
	st, err := h.s.Reserve(context.Background(), h.target, lim, []Request{{ID: h.id, N: n, MaxWait: maxWait}}, g[:])
	require.NoError(t, err)
	st.Joined = false // a RedisStore's heartbeat: TestJoinedTellsWhenAProcessEntersTheCount
	return g[0], st, h.id
}

func granted(d time.Duration) Grant { return Grant{OK: true, Delay: d} }

const sec = time.Second

var storeCases = []storeCase{
	{"admits up to the limit, then books the window's end", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 3, Window: sec}
		for i := range 3 {
			g, st, _ := h.reserve(t, lim, 1, 0)
			require.Equal(t, granted(0), g, "request %d", i)
			require.Equal(t, 2-i, st.Remaining)
		}
		g, st, _ := h.reserve(t, lim, 1, 0)
		require.Equal(t, Grant{Delay: sec}, g)
		require.Equal(t, 0, st.Remaining)
		require.Equal(t, sec, st.ResetAfter)
		for _, want := range []time.Duration{sec, sec, sec, 2 * sec} {
			g, _, _ := h.reserve(t, lim, 1, -1)
			require.Equal(t, granted(want), g)
		}
	}},
	{"the window slides", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 3, Window: sec}
		for _, step := range []struct {
			advance time.Duration
			want    Grant
		}{
			{0, granted(0)},
			{400 * time.Millisecond, granted(0)},
			{400 * time.Millisecond, granted(0)},
			{100 * time.Millisecond, Grant{Delay: 100 * time.Millisecond}},
			{100 * time.Millisecond, granted(0)},
			{100 * time.Millisecond, Grant{Delay: 300 * time.Millisecond}},
			{300 * time.Millisecond, granted(0)},
		} {
			h.clock.Advance(step.advance)
			g, _, _ := h.reserve(t, lim, 1, 0)
			require.Equal(t, step.want, g)
		}
	}},
	{"a refused request writes nothing", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 2, Window: sec}
		h.reserve(t, lim, 1, 0)
		h.reserve(t, lim, 1, 0)
		for range 3 {
			g, _, _ := h.reserve(t, lim, 1, 500*time.Millisecond)
			require.Equal(t, Grant{Delay: sec}, g)
		}
		g, _, _ := h.reserve(t, lim, 1, -1)
		require.Equal(t, granted(sec), g, "refusals must not have taken slots")
	}},
	{"cancel gives the slot to the next waiter", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 2, Window: sec}
		h.reserve(t, lim, 1, 0)
		h.reserve(t, lim, 1, 0)
		h.reserve(t, lim, 1, -1)
		g, _, id := h.reserve(t, lim, 1, -1)
		require.Equal(t, granted(sec), g)
		require.NoError(t, h.s.Cancel(context.Background(), h.target, id, 1))
		require.NoError(t, h.s.Cancel(context.Background(), h.target, id, 1), "cancelling twice is no error")
		g, _, _ = h.reserve(t, lim, 1, -1)
		require.Equal(t, granted(sec), g, "the cancelled slot goes to the next waiter")
		g, _, _ = h.reserve(t, lim, 1, -1)
		require.Equal(t, granted(2*sec), g)
	}},
	{"cancel removes every unit of a request", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 4, Window: sec}
		_, _, id := h.reserve(t, lim, 3, 0)
		require.NoError(t, h.s.Cancel(context.Background(), h.target, id, 3))
		g, st, _ := h.reserve(t, lim, 4, 0)
		require.Equal(t, granted(0), g)
		require.Equal(t, 0, st.Remaining)
	}},
	{"a bad limit is an error and books nothing", func(t *testing.T, h *harness) {
		for _, lim := range []Limit{{Limit: 0, Window: sec}, {Limit: 1, Window: 0}, {Limit: 1, Window: sec, Gap: -1}} {
			_, err := h.s.Reserve(context.Background(), h.target, lim, []Request{{ID: 1, N: 1, MaxWait: -1}}, make([]Grant, 1))
			require.ErrorContains(t, err, "bad limit", "%+v", lim)
		}
		g, st, _ := h.reserve(t, Limit{Limit: 1, Window: sec}, 1, 0)
		require.Equal(t, granted(0), g)
		require.Equal(t, 0, st.Remaining)
	}},
	{"a pause holds everyone and only grows", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 5, Window: sec}
		ctx := context.Background()
		left, err := h.s.Pause(ctx, h.target, 2*sec)
		require.NoError(t, err)
		require.Equal(t, 2*sec, left)
		left, err = h.s.Pause(ctx, h.target, sec)
		require.NoError(t, err)
		require.Equal(t, 2*sec, left, "a shorter pause changes nothing")
		g, st, _ := h.reserve(t, lim, 1, 0)
		require.Equal(t, Grant{Delay: 2 * sec}, g)
		require.Equal(t, 0, st.Remaining)
		require.Equal(t, 2*sec, st.Paused)
		g, _, _ = h.reserve(t, lim, 1, -1)
		require.Equal(t, granted(2*sec), g)
		h.clock.Advance(2 * sec)
		left, err = h.s.Pause(ctx, h.target, 0)
		require.NoError(t, err)
		require.Equal(t, time.Duration(0), left)
		g, _, _ = h.reserve(t, lim, 1, 0)
		require.Equal(t, granted(0), g)
	}},
	{"pacing spaces admissions by the gap", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 10, Window: sec, Gap: 200 * time.Millisecond}
		for i := range 4 {
			g, _, _ := h.reserve(t, lim, 1, -1)
			require.Equal(t, granted(time.Duration(i)*200*time.Millisecond), g)
		}
		h.clock.Advance(time.Second)
		g, _, _ := h.reserve(t, lim, 1, 0)
		require.Equal(t, granted(0), g)
		g, _, _ = h.reserve(t, lim, 1, 0)
		require.Equal(t, Grant{Delay: 200 * time.Millisecond}, g)
	}},
	{"requests of several units", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 5, Window: sec}
		g, _, _ := h.reserve(t, lim, 3, 0)
		require.Equal(t, granted(0), g)
		g, _, _ = h.reserve(t, lim, 3, 0)
		require.Equal(t, Grant{Delay: sec}, g)
		g, st, _ := h.reserve(t, lim, 2, 0)
		require.Equal(t, granted(0), g)
		require.Equal(t, 0, st.Remaining)
		g, _, _ = h.reserve(t, lim, 6, -1)
		require.False(t, g.OK, "more units than the limit can never be granted")
	}},
	{"one call books several slots in order", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 2, Window: sec}
		reqs := []Request{{ID: 1, N: 1, MaxWait: -1}, {ID: 2, N: 1, MaxWait: -1}, {ID: 3, N: 1, MaxWait: 0}, {ID: 4, N: 1, MaxWait: -1}, {ID: 5, N: 1, MaxWait: -1}}
		grants := make([]Grant, len(reqs))
		_, err := h.s.Reserve(context.Background(), h.target, lim, reqs, grants)
		require.NoError(t, err)
		require.Equal(t, []Grant{granted(0), granted(0), {Delay: sec}, granted(sec), granted(sec)}, grants)
	}},
	{"restored entries count", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 3, Window: sec}
		require.NoError(t, h.s.Restore(context.Background(), h.target, sec, []Entry{
			{ID: 100, N: 2, Age: 100 * time.Millisecond},
			{ID: 101, N: 1, Age: 200 * time.Millisecond},
			{ID: 102, N: 5, Age: 2 * sec}, // older than the window: dropped
		}))
		g, _, _ := h.reserve(t, lim, 1, 0)
		require.Equal(t, Grant{Delay: 800 * time.Millisecond}, g)
		require.NoError(t, h.s.Restore(context.Background(), h.target, sec, []Entry{{ID: 103, N: 3, Age: -500 * time.Millisecond}}))
		g, _, _ = h.reserve(t, lim, 1, -1)
		require.Equal(t, granted(1500*time.Millisecond), g, "future placeholders hold the window after them")
	}},
	{"a restored request already in the log keeps one entry, at the later slot", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 3, Window: sec}
		_, _, id := h.reserve(t, lim, 1, 0)
		// The booked request again, later; another twice in one call (a
		// replay retried); a third booked at now and restored earlier.
		require.NoError(t, h.s.Restore(context.Background(), h.target, sec, []Entry{
			{ID: id, N: 1, Age: -500 * time.Millisecond},
			{ID: 200, N: 2, Age: 0},
			{ID: 200, N: 2, Age: -100 * time.Millisecond},
		}))
		// The log holds 200 (two units) at +100ms and id at +500ms.
		g, st, _ := h.reserve(t, Limit{Limit: 4, Window: sec}, 1, -1)
		require.Equal(t, granted(500*time.Millisecond), g, "after id's one entry, with room for a fourth unit")
		require.Equal(t, 1500*time.Millisecond, st.ResetAfter)
		require.NoError(t, h.s.Restore(context.Background(), h.target, sec, []Entry{{ID: id, N: 1, Age: 0}}))
		// Cancelling id removes its only entry, which stayed at +500ms.
		require.NoError(t, h.s.Cancel(context.Background(), h.target, id, 1))
		g, st, _ = h.reserve(t, Limit{Limit: 4, Window: sec}, 1, 0)
		require.Equal(t, Grant{Delay: 500 * time.Millisecond}, g, "FIFO: after the last booking")
		require.Equal(t, 1, st.Remaining)
	}},
	{"reset and tail", func(t *testing.T, h *harness) {
		lim := Limit{Limit: 1, Window: sec}
		_, st, _ := h.reserve(t, lim, 1, 0)
		require.LessOrEqual(t, st.Place, 1, "alone, when told at all")
		st.Place = 0 // a RedisStore tells a process that marks itself live its place; a MemoryStore, one process alone, does not
		require.Equal(t, State{Remaining: 0, ResetAfter: sec, Live: 1}, st)
		_, st, _ = h.reserve(t, lim, 1, -1)
		require.Equal(t, State{Remaining: 0, ResetAfter: 2 * sec, Live: 1, Tail: sec}, st)
		h.clock.Advance(3 * sec)
		_, _, _ = h.reserve(t, lim, 1, 0)
		h.clock.Advance(sec)
		_, st, _ = h.reserve(t, Limit{Limit: 2, Window: sec}, 1, 500*time.Millisecond)
		require.Equal(t, 1, st.Remaining)
	}},
	{"any window holds at most the limit (random operations)", func(t *testing.T, h *harness) {
		for _, lim := range []Limit{{Limit: 5, Window: sec}, {Limit: 4, Window: 700 * time.Millisecond, Gap: 50 * time.Millisecond}} {
			type booking struct {
				at time.Time
				n  int
				id uint64
			}
			var live []booking
			rng := rand.New(rand.NewPCG(1, uint64(lim.Limit)))
			for range 300 {
				h.clock.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
				if len(live) > 0 && rng.IntN(10) == 0 {
					i := rng.IntN(len(live))
					b := live[i]
					if b.at.After(h.clock.Time()) { // only units not yet sent are cancelled
						require.NoError(t, h.s.Cancel(context.Background(), h.target, b.id, b.n))
						live = append(live[:i], live[i+1:]...)
					}
					continue
				}
				n := 1 + rng.IntN(2)
				maxWait := []time.Duration{0, -1, 300 * time.Millisecond}[rng.IntN(3)]
				g, _, id := h.reserve(t, lim, n, maxWait)
				if g.OK {
					live = append(live, booking{at: h.clock.Time().Add(g.Delay), n: n, id: id})
				}
			}
			sort.Slice(live, func(i, j int) bool { return live[i].at.Before(live[j].at) })
			for i, b := range live {
				units := 0
				for _, c := range live[i:] {
					if c.at.Sub(b.at) < lim.Window {
						units += c.n
					}
				}
				require.LessOrEqual(t, units, lim.Limit, "window starting at booking %d", i)
				if i > 0 && lim.Gap > 0 && !live[i-1].at.Equal(b.at) {
					require.GreaterOrEqual(t, b.at.Sub(live[i-1].at), lim.Gap)
				}
			}
			require.Greater(t, len(live), 50, "the test must admit enough to mean something")
			h.target += "-next"
		}
	}},
}

// TestStoreConformance runs every semantic case on the memory store, a real
// single-node Redis and a real three-master Redis Cluster.
func TestStoreConformance(t *testing.T) {
	for _, kind := range storeKinds(t) {
		t.Run(kind.name, func(t *testing.T) {
			for i, c := range storeCases {
				t.Run(c.name, func(t *testing.T) {
					s, clock := kind.new(t)
					// Targets with braces must not break the hash tag.
					h := &harness{s: s, clock: clock, target: fmt.Sprintf("t%d.example{x}", i)}
					c.run(t, h)
				})
			}
		})
	}
}
