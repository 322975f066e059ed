package throttle

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"
)

// target is one quota: its rule and the state this process keeps for it.
type target struct {
	name string
	rule Rule
	lim  Limit

	mu        sync.Mutex // guards everything below
	busy      bool       // a store call for this target is in flight
	queue     []*waiter  // waiters for the next call
	lastBatch int        // waiters in the latest call

	live     int       // the largest live-process count seen lately; 0 until the store answered
	liveAt   time.Time // when live was last confirmed
	tail     time.Time // local time of the latest slot the fleet is known to have booked
	heard    time.Time // when the store last answered a call for this target
	since    time.Time // when the current fallback began
	seedID   uint64    // the local log's placeholder entry of the current fallback
	degraded bool      // the failure policy decides, not the store
	probed   time.Time // last recovery attempt
}

func newTarget(name string, r Rule, margin time.Duration) *target {
	return &target{name: name, rule: r, lim: Limit{Limit: r.Limit, Window: r.Window + margin, Gap: r.Gap}}
}

// waiter is one request in a batch.
type waiter struct {
	req   Request
	ready chan struct{} // made when it queues, closed once: the result is in, or lead is set

	lead  []*waiter // set when this waiter must run the next batch
	grant Grant
	ahead time.Duration // how far ahead the deciding log books; 0: the horizon
	state State         // the target's log after the call
	at    time.Time     // the slot on the local clock
	via   via
	err   error
}

// errStoreDown tells a waiter under FailClosed to try again later.
var errStoreDown = errors.New("store down")

// submit gets w decided. Concurrent waiters of one target share store calls:
// while a call is in flight, newcomers queue, and when it returns the whole
// queue goes in the next call, run by the first of them. It returns an error
// only when ctx ends while w is still queued, in which case nothing was
// reserved for w.
func (t *Throttler) submit(ctx context.Context, tg *target, w *waiter) error {
	tg.mu.Lock()
	if !tg.busy {
		tg.busy = true
		shared := tg.lastBatch > 1
		tg.mu.Unlock()
		batch := []*waiter{w}
		if shared {
			batch = t.lateJoiners(tg, batch)
		}
		t.runBatches(tg, batch)
		return nil
	}
	w.ready = make(chan struct{})
	tg.queue = append(tg.queue, w)
	tg.mu.Unlock()
	select {
	case <-w.ready:
	case <-ctx.Done():
		tg.mu.Lock()
		if i := slices.Index(tg.queue, w); i >= 0 {
			tg.queue = slices.Delete(tg.queue, i, i+1)
			tg.mu.Unlock()
			return waitError(ctx, tg.name)
		}
		tg.mu.Unlock()
		<-w.ready // already part of a call: its result comes soon
	}
	if w.lead != nil {
		t.runBatches(tg, t.lateJoiners(tg, w.lead))
	}
	return nil
}

// lateJoiners adds to a batch the waiters that queue while its leader
// yields once. It runs when the target's calls are shared (a batch handed on
// by the previous call, or a new one after a shared call): the previous call
// has just woken its waiters, and under load they come straight back;
// yielding lets them queue, so the next call carries them instead of
// leaving them a whole round trip behind it. A caller alone never yields.
func (t *Throttler) lateJoiners(tg *target, batch []*waiter) []*waiter {
	if len(batch) >= t.cfg.maxBatch {
		return batch
	}
	runtime.Gosched()
	tg.mu.Lock()
	batch = append(batch, tg.queue...)
	tg.queue = nil
	tg.mu.Unlock()
	return batch
}

// runBatches decides batch, then hands the queue that built up meanwhile to
// its first waiter, who runs it as the next batch.
func (t *Throttler) runBatches(tg *target, batch []*waiter) {
	self := batch[0]
	rest := batch
	if len(batch) > t.cfg.maxBatch {
		batch, rest = batch[:t.cfg.maxBatch], batch[t.cfg.maxBatch:]
	} else {
		rest = nil
	}
	decided := false
	defer func() {
		if decided {
			return
		}
		// The store panicked: fail this batch and the queue rather than
		// leave the target busy forever, then let the panic go on.
		r := recover()
		err := fmt.Errorf("throttle: %q: store call panicked: %v", tg.name, r)
		tg.mu.Lock()
		queued := tg.queue
		tg.queue, tg.busy = nil, false
		tg.mu.Unlock()
		for _, w := range slices.Concat(batch, rest, queued) {
			w.err = err
			if w != self {
				close(w.ready)
			}
		}
		panic(r)
	}()
	t.decide(tg, batch)
	decided = true
	for _, w := range batch {
		if w != self {
			close(w.ready)
		}
	}
	tg.mu.Lock()
	tg.lastBatch = len(batch)
	next := append(rest, tg.queue...)
	tg.queue = nil
	if len(next) == 0 {
		tg.busy = false
		tg.mu.Unlock()
		return
	}
	tg.mu.Unlock()
	next[0].lead = next
	close(next[0].ready)
}

// decide fills in every waiter's result: from the store, or from the failure
// policy when the store fails.
func (t *Throttler) decide(tg *target, batch []*waiter) {
	if tg.degradedNow(t) == nil {
		reqs := make([]Request, len(batch))
		grants := make([]Grant, len(batch))
		for i, w := range batch {
			reqs[i] = w.req
		}
		st, at, err := t.storeReserve(tg, reqs, grants)
		if err == nil {
			for i, w := range batch {
				w.grant, w.via, w.state = grants[i], viaStore, st
				w.at = at.Add(grants[i].Delay)
			}
			return
		}
		t.enterFallback(tg, err)
	}
	switch t.cfg.policy {
	case FailOpen:
		now := t.cfg.now()
		for _, w := range batch {
			w.grant, w.via, w.at = Grant{OK: true}, viaOpen, now
		}
	case FailClosed:
		for _, w := range batch {
			w.err = errStoreDown
		}
	default:
		t.decideLocally(tg, batch)
	}
}

// decideLocally decides batch on the local log with this process's share.
// A waiter is told to wait for the store (errStoreDown) when no share is
// safe, or when it asks for more units than the share. Local bookings reach
// at most one probe interval ahead, so that whatever this process booked
// has landed soon after the store is back.
func (t *Throttler) decideLocally(tg *target, batch []*waiter) {
	share, known := t.share(tg)
	ahead := t.cfg.probeInterval
	var sub []*waiter
	var reqs []Request
	for _, w := range batch {
		if !known || w.req.N > share.Limit {
			w.err = errStoreDown
			continue
		}
		r := w.req
		if r.MaxWait < 0 || r.MaxWait > ahead {
			r.MaxWait = ahead
		}
		sub, reqs = append(sub, w), append(reqs, r)
	}
	if len(sub) == 0 {
		return
	}
	grants := make([]Grant, len(sub))
	st, now := t.local.reserve(tg.name, share, reqs, grants)
	for i, w := range sub {
		w.grant, w.via, w.state, w.ahead = grants[i], viaLocal, st, ahead
		w.at = now.Add(grants[i].Delay)
	}
}

// storeReserve makes one bounded store call and learns from its reply. It
// returns the local time that best matches the store's "now": the middle of
// the round trip, wrong by at most half of it, which the margin absorbs.
func (t *Throttler) storeReserve(tg *target, reqs []Request, grants []Grant) (State, time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.storeTimeout)
	defer cancel()
	start := t.cfg.now()
	st, err := t.store.Reserve(ctx, tg.name, tg.lim, reqs, grants)
	if err != nil {
		return st, time.Time{}, err
	}
	now := t.cfg.now()
	mid := start.Add(now.Sub(start) / 2)
	if st.Paused > 0 { // keep the fleet's pause locally too, for a fallback
		_, _ = t.local.Pause(ctx, tg.name, st.Paused)
	}
	tg.mu.Lock()
	defer tg.mu.Unlock()
	tg.heard = now
	// A fresh low count (say, right after Redis restarted empty) must not
	// raise this process's fallback share: the largest count wins until it
	// has gone unconfirmed for a whole liveness period.
	if st.Live > 0 && (st.Live >= tg.live || now.Sub(tg.liveAt) > tg.liveness()) {
		tg.live = max(st.Live, 1)
		tg.liveAt = now
	}
	if end := mid.Add(st.Tail); end.After(tg.tail) {
		tg.tail = end
	}
	return st, mid, nil
}

// liveness is how long a live count stays good: the store's default
// heartbeat liveness.
func (tg *target) liveness() time.Duration { return max(10*time.Second, 2*tg.lim.Window) }
