package main

import (
	"context"
	"sync"
)

// hostQueue hands the URLs read to the workers so that one host cannot
// stall a crawl of many: a worker takes the first URL in input order whose
// host has fewer than share workers on it. Only when every URL waiting is
// for a host at its share does a host get more (a crawl of one host uses
// every worker). A host whose requests are held back for long (a long
// Retry-After pauses the whole fleet on it, and the transport waits that
// out) thus holds half the workers at most while other hosts' URLs wait.
// Up to room URLs wait at once; put blocks beyond that.
type hostQueue struct {
	share, room int

	mu      sync.Mutex
	changed chan struct{} // closed and made anew on every change
	pending []job
	busy    map[string]int // workers per host
	closed  bool           // no more puts
}

// job is a URL to fetch and the host it is for (or the group of hosts it
// counts with, see crawl).
type job struct{ url, host string }

func newHostQueue(workers, room int) *hostQueue {
	return &hostQueue{share: max(1, workers/2), room: room, changed: make(chan struct{}), busy: map[string]int{}}
}

// signal wakes every put and take waiting for a change. q.mu is held.
func (q *hostQueue) signal() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// put adds j, waiting while room URLs wait. It reports false, leaving j
// out, when ctx ends first.
func (q *hostQueue) put(ctx context.Context, j job) bool {
	for {
		q.mu.Lock()
		if len(q.pending) < q.room {
			q.pending = append(q.pending, j)
			q.signal()
			q.mu.Unlock()
			return true
		}
		ch := q.changed
		q.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// close says no more URLs come: take reports false once none waits.
func (q *hostQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.signal()
	q.mu.Unlock()
}

// take returns the next job for a worker, which calls done with it when
// finished. It reports false when the queue is closed and empty, or ctx
// has ended (the jobs left are drain's).
func (q *hostQueue) take(ctx context.Context) (job, bool) {
	for {
		if ctx.Err() != nil {
			return job{}, false
		}
		q.mu.Lock()
		if len(q.pending) > 0 {
			i := 0
			for k, j := range q.pending {
				if q.busy[j.host] < q.share {
					i = k
					break
				}
			}
			j := q.pending[i]
			q.pending = append(q.pending[:i], q.pending[i+1:]...)
			q.busy[j.host]++
			q.signal()
			q.mu.Unlock()
			return j, true
		}
		if q.closed {
			q.mu.Unlock()
			return job{}, false
		}
		ch := q.changed
		q.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return job{}, false
		}
	}
}

// done gives back the worker that took j. No one waits for it: take
// waits only for a job, put only for room.
func (q *hostQueue) done(j job) {
	q.mu.Lock()
	if q.busy[j.host]--; q.busy[j.host] <= 0 {
		delete(q.busy, j.host)
	}
	q.mu.Unlock()
}

// drain removes and returns the jobs still waiting.
func (q *hostQueue) drain() []job {
	q.mu.Lock()
	defer q.mu.Unlock()
	js := q.pending
	q.pending = nil
	return js
}
