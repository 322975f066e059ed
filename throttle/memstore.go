package throttle

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// MemoryStore is the embedded Store: one process's logs in memory, with the
// same semantics as RedisStore. It is the default store of New, right for a
// single process and for trying fleetgate out.
//
// A sweeper goroutine forgets targets that have been idle for a window; it
// runs until Close. MemoryStore is safe for concurrent use.
type MemoryStore struct {
	now     func() time.Time
	epoch   time.Time // the clock at NewMemoryStore
	base    int64     // epoch in unix µs
	targets sync.Map  // string -> *memTarget

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

type memTarget struct {
	mu     sync.Mutex
	log    []memEntry // sorted by at; log[head:] is live
	head   int
	pause  int64 // unix µs; 0 when none
	window int64 // the last window used, for the sweeper
	dead   bool  // swept: no longer in the map, so not to be written
}

type memEntry struct {
	at int64 // unix µs
	id uint64
}

// MemoryOption configures a MemoryStore.
type MemoryOption func(*MemoryStore, *time.Duration)

// WithMemoryClock makes the store read time from now instead of time.Now.
// Tests use it to control time.
func WithMemoryClock(now func() time.Time) MemoryOption {
	return func(s *MemoryStore, _ *time.Duration) { s.now = now }
}

// WithSweepInterval sets how often idle targets are forgotten; the default is
// one minute. A value <= 0 disables the sweeper.
func WithSweepInterval(d time.Duration) MemoryOption {
	return func(_ *MemoryStore, sweep *time.Duration) { *sweep = d }
}

// NewMemoryStore returns an empty MemoryStore. Close stops its sweeper.
func NewMemoryStore(opts ...MemoryOption) *MemoryStore {
	s := &MemoryStore{now: time.Now, stop: make(chan struct{}), done: make(chan struct{})}
	sweep := time.Minute
	for _, o := range opts {
		o(s, &sweep)
	}
	s.epoch = s.now()
	s.base = s.epoch.UnixMicro()
	if sweep > 0 {
		go s.sweeper(sweep)
	} else {
		close(s.done)
	}
	return s
}

// Close stops the sweeper and waits for it. The store stays usable.
func (s *MemoryStore) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

func (s *MemoryStore) sweeper(every time.Duration) {
	defer close(s.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.sweep()
		}
	}
}

// sweep forgets every target whose log and pause have run out.
func (s *MemoryStore) sweep() {
	now := s.micros(s.now())
	s.targets.Range(func(k, v any) bool {
		t := v.(*memTarget)
		t.mu.Lock()
		t.trim(now, t.window)
		if len(t.log)-t.head == 0 && t.pause <= now {
			t.dead = true
			s.targets.Delete(k)
		}
		t.mu.Unlock()
		return true
	})
}

// micros is t in unix µs, counted from the store's start on the monotonic
// clock when t has one, so that a step of the wall clock (NTP) does not
// stretch or shrink a window.
func (s *MemoryStore) micros(t time.Time) int64 {
	return s.base + t.Sub(s.epoch).Microseconds()
}

// lock returns target name's state, locked. A state the sweeper removed
// after it was looked up is never written: the lookup is repeated.
func (s *MemoryStore) lock(name string) *memTarget {
	for {
		v, ok := s.targets.Load(name)
		if !ok {
			v, _ = s.targets.LoadOrStore(name, &memTarget{})
		}
		t := v.(*memTarget)
		t.mu.Lock()
		if !t.dead {
			return t
		}
		t.mu.Unlock()
	}
}

// trim drops entries at or before now-window, which no future slot depends on.
func (t *memTarget) trim(now, window int64) {
	for t.head < len(t.log) && t.log[t.head].at <= now-window {
		t.head++
	}
	if t.head == len(t.log) {
		t.log, t.head = t.log[:0], 0
	} else if t.head > 64 && t.head > len(t.log)/2 {
		n := copy(t.log, t.log[t.head:])
		t.log, t.head = t.log[:n], 0
	}
}

func (t *memTarget) last() (int64, bool) {
	if len(t.log) == t.head {
		return 0, false
	}
	return t.log[len(t.log)-1].at, true
}

// Reserve implements Store. A limit below 1, a window under a microsecond
// or a negative gap is an error, as in RedisStore.
func (s *MemoryStore) Reserve(ctx context.Context, target string, lim Limit, reqs []Request, grants []Grant) (State, error) {
	if lim.Limit < 1 || lim.Window < time.Microsecond || lim.Gap < 0 {
		return State{}, fmt.Errorf("memory store: reserve %q: bad limit %d per %v, gap %v", target, lim.Limit, lim.Window, lim.Gap)
	}
	st, _ := s.reserve(target, lim, reqs, grants)
	return st, nil
}

// reserve is Reserve, also returning the store's "now" of the decision, so
// that a caller on the same clock knows each slot exactly.
func (s *MemoryStore) reserve(target string, lim Limit, reqs []Request, grants []Grant) (State, time.Time) {
	window, gap := lim.Window.Microseconds(), lim.Gap.Microseconds()
	t := s.lock(target)
	defer t.mu.Unlock()
	// The clock is read under the lock: a time read before it could be
	// older than an entry another caller wrote meanwhile.
	nowT := s.now()
	now := s.micros(nowT)
	t.window = window
	t.trim(now, window)
	pause := t.pause
	if pause <= now {
		pause = 0
	}
	for i, r := range reqs {
		slot := now
		if pause > slot {
			slot = pause
		}
		if last, ok := t.last(); ok {
			slot = max(slot, last)
			if gap > 0 {
				slot = max(slot, last+gap)
			}
		}
		g := Grant{}
		if r.N >= 1 && r.N <= lim.Limit {
			card := len(t.log) - t.head
			if idx := card - (lim.Limit - r.N); idx >= 1 {
				slot = max(slot, t.log[t.head+idx-1].at+window)
			}
			if r.MaxWait < 0 || slot-now <= r.MaxWait.Microseconds() {
				g.OK = true
				for range r.N {
					t.log = append(t.log, memEntry{at: slot, id: r.ID})
				}
			}
		} else {
			slot = now + window
		}
		g.Delay = time.Duration(slot-now) * time.Microsecond
		grants[i] = g
	}
	st := State{Live: 1, Remaining: max(0, lim.Limit-(len(t.log)-t.head))}
	if pause > 0 {
		st.Remaining = 0
		st.Paused = time.Duration(pause-now) * time.Microsecond
	}
	if last, ok := t.last(); ok {
		st.ResetAfter = time.Duration(last+window-now) * time.Microsecond
		if last > now {
			st.Tail = time.Duration(last-now) * time.Microsecond
		}
	}
	return st, nowT
}

// Cancel implements Store.
func (s *MemoryStore) Cancel(ctx context.Context, target string, id uint64, n int) error {
	v, ok := s.targets.Load(target)
	if !ok {
		return nil
	}
	t := v.(*memTarget)
	t.mu.Lock()
	defer t.mu.Unlock()
	live := t.log[t.head:]
	// A request's units are adjacent and usually near the end.
	for i := len(live) - 1; i >= 0 && n > 0; i-- {
		if live[i].id == id {
			j := i
			for j > 0 && live[j-1].id == id && i-j+1 < n {
				j--
			}
			removed := i - j + 1
			live = slices.Delete(live, j, i+1)
			n -= removed
			i = j
		}
	}
	t.log = t.log[:t.head+len(live)]
	return nil
}

// Pause implements Store.
func (s *MemoryStore) Pause(ctx context.Context, target string, d time.Duration) (time.Duration, error) {
	t := s.lock(target)
	defer t.mu.Unlock()
	now := s.micros(s.now())
	if d > 0 && now+d.Microseconds() > t.pause {
		t.pause = now + d.Microseconds()
		if t.window == 0 {
			t.window = d.Microseconds()
		}
	}
	if t.pause <= now {
		return 0, nil
	}
	return time.Duration(t.pause-now) * time.Microsecond, nil
}

// Restore implements Store. As in RedisStore, a request already in the log
// keeps one entry per unit, at the later of its two slots, so a replay
// retried, or a request named twice, counts once. (A request's units are
// restored and kept together: RedisStore names each unit, MemoryStore
// does not, and the two agree while a request is restored with the units
// it was booked with, as the Throttler does.)
func (s *MemoryStore) Restore(ctx context.Context, target string, window time.Duration, entries []Entry) error {
	w := window.Microseconds()
	t := s.lock(target)
	defer t.mu.Unlock()
	now := s.micros(s.now())
	t.window = max(t.window, w)
	t.trim(now, t.window)
	live := t.log[t.head:]
	// had: the slot each restored request already has in the log within
	// window (its first entry's).
	want := make(map[uint64]bool, len(entries))
	for _, e := range entries {
		want[e.ID] = true
	}
	had := make(map[uint64]int64)
	for _, m := range live {
		if _, ok := had[m.id]; !ok && want[m.id] && m.at > now-w {
			had[m.id] = m.at
		}
	}
	// add: the requests to write, in the order they came; latest: each
	// one's place in add; moved: requests whose entries in the log go.
	type restored struct {
		at   int64
		id   uint64
		n    int
		gone bool // a later slot of the same request came after it
	}
	var add []restored
	latest := make(map[uint64]int)
	moved := make(map[uint64]bool)
	for _, e := range entries {
		at := now - e.Age.Microseconds()
		if at <= now-w {
			continue
		}
		if i, ok := latest[e.ID]; ok {
			if add[i].at >= at {
				continue // it stays where it is
			}
			add[i].gone = true
		} else if prev, ok := had[e.ID]; ok {
			if prev >= at {
				continue
			}
			moved[e.ID] = true
		}
		latest[e.ID] = len(add)
		add = append(add, restored{at: at, id: e.ID, n: max(e.N, 1)})
	}
	if len(add) == 0 {
		return nil
	}
	if len(moved) > 0 {
		live = slices.DeleteFunc(live, func(m memEntry) bool { return moved[m.id] })
	}
	// One merge of the log and the new entries, each in slot order; a new
	// entry goes after the entries of its slot already there, and after
	// the new ones of that slot that came before it. (Inserting each unit
	// at its place cost n² moves: a Throttler seeds its local log with its
	// whole share as one request when it falls back.)
	slices.SortStableFunc(add, func(a, b restored) int { return cmp.Compare(a.at, b.at) })
	units := 0
	for _, r := range add {
		if !r.gone {
			units += r.n
		}
	}
	merged := make([]memEntry, 0, len(live)+units)
	i := 0
	for _, r := range add {
		if r.gone {
			continue
		}
		for i < len(live) && live[i].at <= r.at {
			merged = append(merged, live[i])
			i++
		}
		for range r.n {
			merged = append(merged, memEntry{at: r.at, id: r.id})
		}
	}
	t.log, t.head = append(merged, live[i:]...), 0
	return nil
}

// entries returns a copy of target's log within window of now, as ages,
// for replaying it into another store, leaving out entries of request skip.
// Entries of one request are merged. The log itself is left as it is.
func (s *MemoryStore) entries(target string, window time.Duration, skip uint64) []Entry {
	v, ok := s.targets.Load(target)
	if !ok {
		return nil
	}
	t := v.(*memTarget)
	t.mu.Lock()
	defer t.mu.Unlock()
	now := s.micros(s.now())
	var out []Entry
	for _, e := range t.log[t.head:] {
		if e.id == skip || e.at <= now-window.Microseconds() {
			continue
		}
		age := time.Duration(now-e.at) * time.Microsecond
		if n := len(out); n > 0 && out[n-1].ID == e.id && out[n-1].Age == age {
			out[n-1].N++
			continue
		}
		out = append(out, Entry{ID: e.id, N: 1, Age: age})
	}
	return out
}
