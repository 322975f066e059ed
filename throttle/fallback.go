package throttle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// prober is implemented by stores that can check their health on a fresh
// connection (RedisStore).
type prober interface {
	Probe(ctx context.Context) error
}

// pauseReader is implemented by stores whose pause read can be a hold of
// their own (RedisStore: a young store's), which the Throttler logs.
type pauseReader interface {
	readPause(ctx context.Context, target string) (time.Duration, bool, error)
}

// bookingChecker is a store that can tell, with the pause, whether a
// booking is still in the log (a RedisStore: Redis may lose it in a
// failover).
type bookingChecker interface {
	checkBooking(ctx context.Context, target string, id uint64, n int) (left time.Duration, young, lost bool, err error)
}

// enterFallback switches tg to the failure policy after a store error.
func (t *Throttler) enterFallback(tg *target, cause error) {
	now := t.cfg.now()
	tg.mu.Lock()
	if tg.degraded {
		tg.mu.Unlock()
		return
	}
	if t.cfg.policy == FailLocal {
		// Reservations booked before the failure, by any process, may land
		// up to the horizon from now, and other processes may have used the
		// whole window: the local log starts full there, so the first local
		// admission comes a whole window after anything the fleet booked.
		// Seeded before anyone sees degraded.
		share := tg.shareLocked()
		ahead := max(tg.tail.Sub(now), t.horizon(tg))
		ahead += tg.turnAfter(now.Add(ahead+share.Window), share)
		tg.seedID = nextID()
		seed := []Entry{{ID: tg.seedID, N: share.Limit, Age: -ahead}}
		_ = t.local.Restore(context.Background(), tg.name, share.Window, seed)
	}
	tg.degraded, tg.probed, tg.since = true, now, now
	tg.mu.Unlock()
	t.storeDown(tg, now, cause)
}

// turnAfter returns how long after first, the earliest local admission a
// fallback allows, this process's turn comes. The shares keep the rule's
// gap times the live count, so processes that fell back together would
// send together once per such gap. Instead each starts at its place's
// gaps past a whole number of windows on the clock: a share that keeps
// sending repeats every window (its part of the limit a share's gap
// apart, then a window after the first), so the processes' shares take
// turns a gap apart for as long as they send, however far apart the
// moments they fell back, as far as their clocks agree and their places
// are current. It is 0 when the rule has no gap, the share is the whole
// limit, or the store never told this process its place. tg.mu is held.
func (tg *target) turnAfter(first time.Time, share Limit) time.Duration {
	if share.Gap <= tg.lim.Gap || tg.place < 1 || tg.place > tg.live {
		return 0
	}
	w := int64(share.Window)
	turn := int64(tg.place-1) * int64(tg.lim.Gap) % w
	return time.Duration(((turn-first.UnixNano()%w)%w + w) % w)
}

// storeDown records that the store failed for tg at now. One line per
// outage, not per target: first_target is the target whose call failed
// first.
func (t *Throttler) storeDown(tg *target, now time.Time, cause error) {
	t.failedAt.Store(now.UnixNano())
	if t.down.CompareAndSwap(false, true) {
		// A killed Redis most often shows as a timeout (go-redis redials
		// and backs off past the store timeout): say which timeout.
		var ne net.Error
		var ut *unitsTimeout
		switch {
		case errors.As(cause, &ut): // names its own timeout
		case errors.Is(cause, context.DeadlineExceeded) || errors.As(cause, &ne) && ne.Timeout():
			cause = fmt.Errorf("no answer within the store timeout (%v): %w", t.cfg.storeTimeout, cause)
		}
		t.fellBack.Store(now.UnixNano())
		t.cfg.logger.Warn("fleetgate: store failed; deciding by the failure policy",
			"policy", t.cfg.policy.String(), "first_target", tg.name, "error", cause)
	}
}

// degradedNow returns nil when tg should be decided by the store: it is not
// degraded, or it was and the store is back (after replaying what this
// process admitted locally). It tries at most once per probe interval, and
// at once when another target has found the store back since its last try,
// so that a target is decided by the store again at its next call once
// Mode says so.
func (tg *target) degradedNow(t *Throttler) error {
	tg.mu.Lock()
	if !tg.degraded {
		tg.mu.Unlock()
		return nil
	}
	now := t.cfg.now()
	backSince := !t.down.Load() && t.backAt.Load() > tg.probed.UnixNano()
	if now.Sub(tg.probed) < t.cfg.probeInterval && !backSince {
		tg.mu.Unlock()
		return errStoreDown
	}
	tg.probed = now
	live, seed := tg.live, tg.seedID
	tg.mu.Unlock()

	if err := t.probe(now); err != nil {
		t.storeDown(tg, now, err) // again, if another target found it back meanwhile
		return err
	}
	var entries []Entry
	if t.cfg.policy == FailLocal {
		// What this process admitted locally (not the seed: the store kept
		// or, if it lost its log, noticed the fleet's bookings), then
		// placeholders for the others' shares, dated as far ahead as their
		// local bookings reach plus the grace they may take to notice the
		// store is back.
		share, _ := t.share(tg)
		entries = t.local.entries(tg.name, tg.lim.Window, seed)
		// Every process names the placeholders alike, so the processes
		// that come back one after another do not stack them up.
		for i := range min((live-1)*share.Limit, tg.lim.Limit) {
			entries = append(entries, Entry{ID: SharedEntry | uint64(i+1), N: 1, Age: -(t.cfg.probeInterval + t.cfg.grace)})
		}
	}
	units := 0
	for _, e := range entries {
		units += e.N
	}
	timeout := t.storeTimeoutFor(units)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := t.store.Restore(ctx, tg.name, tg.lim.Window, entries); err != nil {
		err = unitsTimedOut(ctx, err, timeout, units)
		t.storeDown(tg, now, err)
		return err
	}
	tg.mu.Lock()
	tg.degraded = false
	tg.mu.Unlock()
	// Stamped after the replay, so that a target that failed meanwhile
	// tries again at its next call.
	t.storeBack(tg, now)
	return nil
}

// storeBack records that the store answered for tg, which it had been
// found back for (degradedNow) or never failed for (storeReserve, once no
// call has failed for a while), while the Throttler was in fallback. It
// stamps when, so that every target the store failed for tries it again
// at its next call (degradedNow), and before down is cleared, since forget
// reads it once down is clear; and it logs one line per outage:
// first_target is the first target back, the others come back at their
// next calls. since is when the call began.
func (t *Throttler) storeBack(tg *target, since time.Time) {
	t.backAt.Store(t.cfg.now().UnixNano())
	if t.down.CompareAndSwap(true, false) {
		t.cfg.logger.Info("fleetgate: store is back; deciding by the store again",
			"first_target", tg.name, "after", since.Sub(time.Unix(0, t.fellBack.Load())).Round(time.Millisecond))
	}
}

// probe checks, on a fresh connection, whether the store answers again,
// once per probe interval for all the Throttler's targets.
func (t *Throttler) probe(now time.Time) error {
	p, ok := t.store.(prober)
	if !ok {
		return nil
	}
	t.probeMu.Lock()
	defer t.probeMu.Unlock()
	if !t.probeAt.IsZero() && now.Sub(t.probeAt) < t.cfg.probeInterval {
		return t.probeErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.storeTimeout)
	defer cancel()
	t.probeAt, t.probeErr = now, p.Probe(ctx)
	return t.probeErr
}

// horizon is how far ahead the store may book for tg.
func (t *Throttler) horizon(tg *target) time.Duration {
	if t.cfg.maxAhead > 0 {
		return t.cfg.maxAhead
	}
	return tg.lim.Window
}

// share is this process's part of tg's limit while the store is down: N
// divided by the live processes. known is false when no share is safe, and
// the process then waits for the store. With s = shareSpan(tg), half the
// liveness L:
//   - the store never gave a count of the processes sharing the target, or
//     its last count came more than s before this process noticed the
//     failure: processes may have joined since;
//   - this process joined the target's count (or came back to it after it
//     dropped out) less than s before its last count, and others were
//     counted then: they may not have heard of it before the failure;
//   - the processes outnumber the limit's units (a longer window per
//     process would bound the average, not the count in one window).
//
// When the first two hold for processes P and J, and the failure came at
// X: P counted J, since P's last count came after X - s, and J joined
// before its own last count minus s, so before X - s. And J counted P: a
// process marks itself at least every L/4 while it calls, so P's mark is
// at most s + L/4 = 3L/4 old at J's last count, still in the count. So
// every process with a share counted every other one, and the shares add
// up to N at most. A process that joined alone needs no wait: every
// process with a share now had a mark less than 3L/4 old when it joined,
// so there was none. The argument holds for processes that share a rule,
// a margin (the liveness grows with the window) and a store liveness.
func (t *Throttler) share(tg *target) (l Limit, known bool) {
	s := t.shareSpan(tg)
	tg.mu.Lock()
	defer tg.mu.Unlock()
	known = tg.live > 0 && tg.live <= tg.lim.Limit &&
		tg.since.Sub(tg.heard) <= s && (tg.alone || tg.heard.Sub(tg.joined) >= s)
	return tg.shareLocked(), known
}

// shareSpan is how recent a process's fleet count must be for a share, and
// how long before it the process must have joined: half the liveness
// (at least two windows). A process with waiters calls the store about once
// per window (each books up to a window ahead and calls again when its slot
// comes), so its count stays fresh.
func (t *Throttler) shareSpan(tg *target) time.Duration { return t.liveness(tg) / 2 }

func (tg *target) shareLocked() Limit {
	live := max(tg.live, 1)
	l := tg.lim
	if live == 1 || live > l.Limit {
		return l
	}
	return Limit{Limit: l.Limit / live, Window: l.Window, Gap: l.Gap * time.Duration(live)}
}
