package throttle

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// shareDeadlines is how long one store-call context takes new calls: a call
// gets a deadline at least the store timeout, at most this much more, after
// it starts. Sharing it spares each call a timer of its own, which was 5% of
// a decision's client CPU with eight goroutines over many targets
// (BENCHMARKS.md).
const shareDeadlines = time.Millisecond

// deadlines hands out the contexts of store calls: calls that start within
// shareDeadlines of one another share one, bounded by the store timeout.
// The zero value is ready to use.
type deadlines struct {
	cur atomic.Pointer[sharedDeadline]
}

// sharedDeadline is one context and the calls that hold it. Its timer is
// stopped when the last of them lets go after a newer one has replaced it,
// or fires at its deadline, whichever comes first.
type sharedDeadline struct {
	ctx    context.Context
	cancel context.CancelFunc
	until  time.Time    // the latest start it takes
	users  atomic.Int64 // calls holding it, plus one while it is current
}

// get returns the shared deadline for a store call that starts now (the
// wall clock's: the context's timer runs on it): its ctx bounds the call by
// timeout, and the caller calls its release when the call is done. (A
// returned release func cost each call an allocation.)
func (d *deadlines) get(now time.Time, timeout time.Duration) *sharedDeadline {
	cur := d.cur.Load()
	if cur != nil && !now.After(cur.until) && cur.hold() {
		return cur
	}
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(timeout+shareDeadlines))
	next := &sharedDeadline{ctx: ctx, cancel: cancel, until: now.Add(shareDeadlines)}
	next.users.Store(2) // current, and held by this call
	if d.cur.CompareAndSwap(cur, next) {
		if cur != nil {
			cur.release() // no longer current
		}
	} else {
		next.users.Add(-1) // another call replaced cur first: next serves this call alone
	}
	return next
}

// hold takes a share of s, unless every holder has already let go.
func (s *sharedDeadline) hold() bool {
	for n := s.users.Load(); n > 0; n = s.users.Load() {
		if s.users.CompareAndSwap(n, n+1) {
			return true
		}
	}
	return false
}

// release lets go of s: a call holding it is done.
func (s *sharedDeadline) release() {
	if s.users.Add(-1) == 0 {
		s.cancel()
	}
}

// perUnitTimeout is how much longer than the store timeout a store call of
// more than sharedUnits units may take for each unit it books, cancels or
// restores past the first (a decision's call of fewer shares a deadline
// within shareDeadlines of the store timeout). A Redis
// script run writes or removes one log entry per unit: 1.5-5 µs each to
// book or cancel on an idle local server, 4-8 µs to restore (BENCHMARKS.md,
// §4, "Requests of many units"); with the store timeout alone, a request
// of 20,000 units would time out on a healthy store.
const perUnitTimeout = 20 * time.Microsecond

// storeTimeoutFor is the timeout of a store call that carries units units.
func (t *Throttler) storeTimeoutFor(units int) time.Duration {
	return t.cfg.storeTimeout + time.Duration(max(units-1, 0))*perUnitTimeout
}

// unitsTimeout is a store call of many units that ran out of its timeout,
// the store timeout and perUnitTimeout a unit past the first.
type unitsTimeout struct {
	timeout time.Duration
	units   int
	err     error
}

func (e *unitsTimeout) Error() string {
	return fmt.Sprintf("no answer within %v, the store timeout and %v for each of %d units past the first: %v",
		e.timeout, perUnitTimeout, e.units-1, e.err)
}

func (e *unitsTimeout) Unwrap() error { return e.err }

// unitsTimedOut returns err, the error of a store call of units units under
// ctx, which had timeout: as a unitsTimeout when ctx ran out and the call
// had more than sharedUnits units, so that the log names its timeout.
func unitsTimedOut(ctx context.Context, err error, timeout time.Duration, units int) error {
	if units <= sharedUnits || ctx.Err() == nil {
		return err
	}
	return &unitsTimeout{timeout: timeout, units: units, err: err}
}
