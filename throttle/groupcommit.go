package throttle

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
)

// groupCommit shares calls among concurrent callers: while lanes calls are
// in flight, newcomers queue, and when a call returns the queue that built
// up meanwhile (up to max at a time) goes in the next call, run by the
// first of it. A Throttler keeps one per target (one lane: concurrent
// waiters of a target share store calls); a RedisStore on a single node
// keeps one for all targets (a few lanes: script runs shared across
// targets). It owns no goroutine: callers run the calls.
type groupCommit[T committer[T]] struct {
	lanes, max int

	mu       sync.Mutex // guards everything below
	inflight int        // calls in flight, at most lanes
	queue    []T        // callers for the next call
	last     int        // callers in the latest call
}

// committer is what a groupCommit's callers are: comparable (pointers, in
// practice) and carrying their link.
type committer[T any] interface {
	comparable
	link() *commitLink[T]
}

// commitLink is a caller's part of a groupCommit.
type commitLink[T any] struct {
	ready chan struct{} // made when it queues, closed once: its result is in, or lead is set
	lead  []T           // set when this caller must run the next call
	alone [1]T          // the batch of a caller that runs its own call
}

// do gets x decided by run, alone or with others: run(batch) fills in the
// result of every caller in batch. It reports false only when ctx ends
// while x is still queued, in which case run never saw x. When run panics,
// fail(callers, err) records err for the callers of that call and of the
// queue, which are all woken, and the panic goes on in the goroutine that
// ran it: no caller waits forever and the lane is given back.
func (g *groupCommit[T]) do(ctx context.Context, x T, run func(batch []T), fail func(callers []T, err error)) bool {
	g.mu.Lock()
	if g.inflight < g.lanes {
		g.inflight++
		shared := g.last > 1
		g.mu.Unlock()
		l := x.link()
		l.alone[0] = x
		batch := l.alone[:] // no allocation for a caller alone
		if shared {
			batch = g.lateJoiners(batch)
		}
		g.runBatches(batch, run, fail)
		return true
	}
	l := x.link()
	l.ready = make(chan struct{})
	g.queue = append(g.queue, x)
	g.mu.Unlock()
	select {
	case <-l.ready:
	case <-ctx.Done():
		g.mu.Lock()
		if i := slices.Index(g.queue, x); i >= 0 {
			g.queue = slices.Delete(g.queue, i, i+1)
			g.mu.Unlock()
			return false
		}
		g.mu.Unlock()
		<-l.ready // already part of a call: its result comes soon
	}
	if l.lead != nil {
		g.runBatches(g.lateJoiners(l.lead), run, fail)
	}
	return true
}

// lateJoiners adds to a batch the callers that queue while its leader
// yields once. It runs when calls are shared (a batch handed on by the
// previous call, or a new one after a call of several callers): the
// previous call has just woken its callers, and under load they come
// straight back; yielding lets them queue, so the next call carries them
// instead of leaving them a whole round trip behind it (on two cores it
// doubled the decisions per second of 8 goroutines on one target,
// BENCHMARKS.md). A caller alone never yields.
func (g *groupCommit[T]) lateJoiners(batch []T) []T {
	if len(batch) >= g.max {
		return batch
	}
	runtime.Gosched()
	g.mu.Lock()
	batch = append(batch, g.queue...)
	g.queue = nil
	g.mu.Unlock()
	return batch
}

// runBatches runs batch, then hands the queue that built up meanwhile to
// its first caller, who runs it next in the same lane.
func (g *groupCommit[T]) runBatches(batch []T, run func([]T), fail func([]T, error)) {
	self := batch[0]
	var rest []T
	if len(batch) > g.max {
		batch, rest = batch[:g.max], batch[g.max:]
	}
	ran := false
	defer func() {
		if ran {
			return
		}
		r := recover()
		g.mu.Lock()
		queued := g.queue
		g.queue = nil
		g.inflight--
		g.mu.Unlock()
		callers := slices.Concat(batch, rest, queued)
		fail(callers, fmt.Errorf("call panicked: %v", r))
		for _, c := range callers {
			if c != self {
				close(c.link().ready)
			}
		}
		panic(r)
	}()
	run(batch)
	ran = true
	for _, c := range batch {
		if c != self {
			close(c.link().ready)
		}
	}
	g.mu.Lock()
	g.last = len(batch)
	next := append(rest, g.queue...)
	g.queue = nil
	if len(next) == 0 {
		g.inflight--
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	next[0].link().lead = next
	close(next[0].link().ready)
}

// idle reports whether no call is in flight.
func (g *groupCommit[T]) idle() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inflight == 0
}
