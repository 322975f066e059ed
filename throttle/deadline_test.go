package throttle

import (
	"context"
	"sync"
	"testing"
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
