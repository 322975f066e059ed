package throttle

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDeadlinesShareOneContextPerMillisecond(t *testing.T) {
	var d deadlines
	t0 := time.Now()
	const timeout = 30 * time.Millisecond

	sa, sb := d.get(t0, timeout), d.get(t0.Add(shareDeadlines/2), timeout)
	a, doneA, b, doneB := sa.ctx, sa.release, sb.ctx, sb.release
	assert.Same(t, a, b, "calls that start within shareDeadlines share a context")
	dl, ok := b.Deadline()
	require.True(t, ok)
	assert.False(t, dl.Before(t0.Add(shareDeadlines/2).Add(timeout)), "the later call still gets the whole timeout")

	sc := d.get(t0.Add(2*shareDeadlines), timeout)
	c, doneC := sc.ctx, sc.release
	assert.NotSame(t, a, c, "a call after shareDeadlines gets a new context")
	doneA()
	assert.NoError(t, a.Err(), "a replaced context stays live while a call holds it")
	doneB()
	assert.ErrorIs(t, a.Err(), context.Canceled, "the last holder of a replaced context stops its timer")
	assert.NoError(t, c.Err(), "the current context outlives its calls")
	doneC()
	assert.NoError(t, c.Err())

	se := d.get(t0.Add(2*shareDeadlines), timeout)
	defer se.release()
	assert.Same(t, c, se.ctx, "the current context takes new calls after its calls let go")
}

func TestDeadlinesEndAtTheirDeadline(t *testing.T) {
	var d deadlines
	s := d.get(time.Now(), time.Millisecond)
	defer s.release()
	select {
	case <-s.ctx.Done():
		assert.ErrorIs(t, s.ctx.Err(), context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("the context outlived its deadline")
	}
}

func TestDeadlinesUnderConcurrentUse(t *testing.T) {
	var d deadlines
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 2000 {
				s := d.get(time.Now(), time.Minute)
				if err := s.ctx.Err(); err != nil {
					t.Errorf("a context handed out was already done: %v", err)
				}
				s.release()
			}
		})
	}
	wg.Wait()
	cur := d.cur.Load()
	require.NotNil(t, cur)
	assert.EqualValues(t, 1, cur.users.Load(), "every call let go; only the current mark is left")
}

// timedStore is a flakyStore that records how long each call's context had
// left when the call came in, by operation.
type timedStore struct {
	*flakyStore
	mu   sync.Mutex
	left map[string]time.Duration
}

func (s *timedStore) note(ctx context.Context, op string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dl, ok := ctx.Deadline()
	if !ok {
		s.left[op] = -1
		return
	}
	s.left[op] = time.Until(dl)
}

func (s *timedStore) leftFor(op string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.left[op]
}

func (s *timedStore) Reserve(ctx context.Context, target string, lim Limit, reqs []Request, grants []Grant) (State, error) {
	s.note(ctx, "reserve")
	return s.flakyStore.Reserve(ctx, target, lim, reqs, grants)
}

func (s *timedStore) Cancel(ctx context.Context, target string, id uint64, n int) error {
	s.note(ctx, "cancel")
	return s.flakyStore.Cancel(ctx, target, id, n)
}

func (s *timedStore) Restore(ctx context.Context, target string, window time.Duration, entries []Entry) error {
	s.note(ctx, "restore")
	return s.flakyStore.Restore(ctx, target, window, entries)
}

// A store writes one log entry per unit, so a call that carries many units
// gets perUnitTimeout more for each past the first: with the store timeout
// alone, a request of 20,000 units timed out on a healthy Redis every time.
func TestStoreCallsGetMoreTimeForManyUnits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &timedStore{flakyStore: &flakyStore{MemoryStore: NewMemoryStore()}, left: map[string]time.Duration{}}
		defer store.Close()
		rules, err := ParseRules("*=20000/1s")
		require.NoError(t, err)
		const timeout = 30 * time.Millisecond
		tr, err := New(rules, WithStore(store), WithStoreTimeout(timeout), WithLogger(quietLogger()))
		require.NoError(t, err)
		defer tr.Close()
		ctx := context.Background()
		const host = "units.example"

		_, err = tr.Allow(ctx, host)
		require.NoError(t, err)
		left := store.leftFor("reserve")
		assert.GreaterOrEqual(t, left, timeout, "one unit: the store timeout")
		assert.LessOrEqual(t, left, timeout+shareDeadlines, "one unit: the store timeout, or a deadline shared within a millisecond")

		require.NoError(t, tr.WaitN(ctx, host, 10_000))
		assert.Equal(t, timeout+9_999*perUnitTimeout, store.leftFor("reserve"), "10,000 units")

		r, err := tr.ReserveN(ctx, host, 20_000)
		require.NoError(t, err)
		require.NoError(t, r.Cancel(ctx))
		assert.Equal(t, timeout+19_999*perUnitTimeout, store.leftFor("cancel"), "a cancel of 20,000 units")

		// Waiters that share a call count no more units than the rule
		// books up to its horizon (a window ahead): three windows' worth.
		tg, err := tr.target(ctx, host)
		require.NoError(t, err)
		reqs := make([]Request, 5)
		for i := range reqs {
			reqs[i] = Request{ID: nextID(), N: 20_000, MaxWait: -1}
		}
		_, _, err = tr.storeReserve(tg, reqs, make([]Grant, len(reqs)))
		require.NoError(t, err)
		assert.Equal(t, timeout+(3*20_000-1)*perUnitTimeout, store.leftFor("reserve"), "five waiters of 20,000 units")

		// Back from the fallback, a process replays the other process's
		// share (the store counts two) as 10,000 one-unit placeholders.
		store.fail.Store(true)
		_, err = tr.Allow(ctx, host)
		require.ErrorIs(t, err, ErrStoreUnavailable, "a process that joined a moment ago has no safe share")
		require.Equal(t, ModeFallback, tr.Mode())
		time.Sleep(time.Second)
		store.fail.Store(false)
		_, err = tr.Allow(ctx, host)
		require.NoError(t, err)
		require.Equal(t, ModeStore, tr.Mode())
		assert.Equal(t, int64(10_000), store.restored.Load())
		assert.Equal(t, timeout+9_999*perUnitTimeout, store.leftFor("restore"), "a restore of 10,000 units")
	})
}
