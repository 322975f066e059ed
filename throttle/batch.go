package throttle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// target is one quota: its rule and the state this process keeps for it.
type target struct {
	name string
	rule Rule
	lim  Limit

	calls groupCommit[*waiter] // concurrent waiters share store calls

	// pauseEnd is the end of the fleet's pause as this process last heard
	// of it (local clock, unix ns; 0: none): from Pause, or from a store's
	// reply. A store grant inside it is given back (lostPause), so that a
	// pause outlives a store that lost it (Redis restarted empty).
	pauseEnd     atomic.Int64
	pauseChecked atomic.Int64 // when a waiter last checked the store's pause (local clock, unix ns)

	mu       sync.Mutex // guards everything below
	live     int        // the largest live-process count seen lately; 0 until the store answered
	place    int        // this process's place among the live processes, from 1, as the store last told it; 0 until it did
	liveAt   time.Time  // when live was last confirmed
	tail     time.Time  // local time of the latest slot the fleet is known to have booked
	heard    time.Time  // when the store last answered a call for this target
	joined   time.Time  // when this process joined the target's live processes: the store's first answer, or its latest that said Joined
	alone    bool       // and it was the only one then
	since    time.Time  // when the current fallback began
	seedID   uint64     // the local log's placeholder entry of the current fallback
	degraded bool       // the failure policy decides, not the store
	probed   time.Time  // last recovery attempt
}

func newTarget(name string, r Rule, margin, ahead time.Duration, maxBatch int) *target {
	return &target{name: name, rule: r, lim: Limit{Limit: r.Limit, Window: r.Window + margin, Gap: r.Gap, Ahead: ahead},
		calls: groupCommit[*waiter]{lanes: 1, max: maxBatch}}
}

// pauseUntil records that the fleet's pause of tg lasts until end; a pause
// only grows.
func (tg *target) pauseUntil(end time.Time) {
	e := end.UnixNano()
	for cur := tg.pauseEnd.Load(); e > cur && !tg.pauseEnd.CompareAndSwap(cur, e); cur = tg.pauseEnd.Load() {
	}
}

// pauseLeft returns what is left at now of the pause this process knows of.
func (tg *target) pauseLeft(now time.Time) time.Duration {
	e := tg.pauseEnd.Load()
	if e == 0 {
		return 0
	}
	return max(0, time.Unix(0, e).Sub(now))
}

// waiter is one request in a batch.
type waiter struct {
	commitLink[*waiter]
	req   Request
	grant Grant
	ahead time.Duration // how far ahead the deciding log books; 0: the horizon
	state State         // the target's log after the call
	at    time.Time     // the slot on the local clock
	via   via
	err   error

	one struct { // a batch of this waiter alone: decide's request and grant
		req   [1]Request
		grant [1]Grant
	}
}

// errStoreDown tells a waiter under FailClosed to try again later.
var errStoreDown = errors.New("store down")

// submit gets w decided. Concurrent waiters of one target share store calls
// (see groupCommit). It returns an error only when ctx ends while w is
// still queued, in which case nothing was reserved for w.
func (t *Throttler) submit(ctx context.Context, tg *target, w *waiter) error {
	run := func(batch []*waiter) { t.decide(tg, batch) }
	fail := func(batch []*waiter, err error) {
		for _, w := range batch {
			w.err = fmt.Errorf("throttle: %q: store %w", tg.name, err)
		}
	}
	if !tg.calls.do(ctx, w, run, fail) {
		return waitError(ctx, tg.name)
	}
	return nil
}

func (w *waiter) link() *commitLink[*waiter] { return &w.commitLink }

// decide fills in every waiter's result: from the store, or from the failure
// policy when the store fails.
func (t *Throttler) decide(tg *target, batch []*waiter) {
	if tg.degradedNow(t) == nil {
		var reqs []Request
		var grants []Grant
		if len(batch) == 1 { // the usual call: its own buffers, no allocation
			w := batch[0]
			w.one.req, w.one.grant = [1]Request{w.req}, [1]Grant{}
			reqs, grants = w.one.req[:], w.one.grant[:]
		} else {
			reqs, grants = make([]Request, len(batch)), make([]Grant, len(batch))
			for i, w := range batch {
				reqs[i] = w.req
			}
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
	start := time.Now() // the deadline's timer runs on the wall clock
	// No more can be booked than the limit for every window up to the
	// horizon, however many units the waiters ask for.
	units := min(unitsOf(reqs), tg.lim.Limit*(2+int(t.horizon(tg)/tg.lim.Window)))
	var ctx context.Context
	timeout := t.storeTimeoutFor(units)
	if units <= sharedUnits {
		dl := t.deadlines.get(start, t.cfg.storeTimeout)
		defer dl.release()
		ctx = dl.ctx
	} else { // many units: longer than a shared deadline allows
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.Background(), start.Add(timeout))
		defer cancel()
	}
	if t.cfg.testClock {
		start = t.cfg.now()
	}
	st, err := t.store.Reserve(ctx, tg.name, tg.lim, reqs, grants)
	if err != nil {
		return st, time.Time{}, unitsTimedOut(ctx, err, timeout, units)
	}
	now := t.cfg.now()
	if t.down.Load() && now.Sub(time.Unix(0, t.failedAt.Load())) > t.cfg.probeInterval+t.cfg.storeTimeout {
		// A target the store never failed for answers, and no store call
		// has failed for a probe interval (a target the store fails for
		// tries it at least that often while it is called): the store is
		// back, though the targets it failed for are not called again.
		t.storeBack(tg, start)
	}
	mid := start.Add(now.Sub(start) / 2)
	if st.Paused > 0 { // keep the fleet's pause locally too, for a fallback and a lost store
		if st.Young || st.Lost { // logged below
			tg.pauseUntil(mid.Add(st.Paused))
		} else {
			t.heardPause(tg, now, mid.Add(st.Paused), false)
		}
		_, _ = t.local.Pause(ctx, tg.name, st.Paused)
	}
	if st.Young {
		t.logYoung(tg, now, st.Paused)
	}
	if st.Lost {
		t.logLost(tg, now, st.Paused)
	}
	liveness := t.liveness(tg)
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if st.Live > 0 { // an answer without a count (lost in a restart) tells nothing of the fleet
		tg.heard = now
	}
	if tg.joined.IsZero() || st.Joined {
		tg.joined, tg.alone = now, st.Live == 1
	}
	// A fresh low count (say, right after Redis restarted empty) must not
	// raise this process's fallback share: the largest count wins until it
	// has gone unconfirmed for a whole liveness period.
	if st.Live > 0 && (st.Live >= tg.live || now.Sub(tg.liveAt) > liveness) {
		tg.live = max(st.Live, 1)
		tg.liveAt = now
	}
	if st.Place > 0 {
		tg.place = st.Place
	}
	if end := mid.Add(st.Tail); end.After(tg.tail) {
		tg.tail = end
	}
	return st, mid, nil
}

// heardPause records that the fleet's pause of tg lasts until end, as this
// process learned at now: from its own Pause (here), or from the store. It
// logs the pause at Info when it is news, so that no process held by it
// seems hung: none this process knew of lasts, or this one ends more than
// a second after it. A process logs each pause once however many of its
// requests meet it (a burst of 429s, every waiter), and again when it is
// extended by more than a second.
func (t *Throttler) heardPause(tg *target, now, end time.Time, here bool) {
	known := tg.pauseEnd.Load()
	if end.After(now) && (known <= now.UnixNano() || end.UnixNano() > known+int64(time.Second)) {
		by := "another process"
		if here {
			by = "this process"
		}
		t.cfg.logger.Info("fleetgate: the target is paused for the whole fleet: requests to it wait until the pause ends",
			"target", tg.name, "held", end.Sub(now).Round(time.Millisecond), "set_by", by)
	}
	tg.pauseUntil(end)
}

// logYoung logs that the store holds tg for d because its data is young:
// otherwise a fleet started on a fresh Redis, or after it restarted empty,
// seems stuck.
func (t *Throttler) logYoung(tg *target, now time.Time, d time.Duration) {
	t.logHold(&t.youngLog, slog.LevelInfo, "fleetgate: the store's data is new (Redis is new, restarted empty or was flushed) and logs may have been lost: "+
		"targets found empty are held until a horizon and a window (two windows by default) after it began", tg, now, d)
}

// logLost logs that the store holds tg for d because Redis lost bookings
// this process had seen: a fault worth an operator's eye, and the reason
// the fleet stops sending for a while.
func (t *Throttler) logLost(tg *target, now time.Time, d time.Duration) {
	t.logHold(&t.lostLog, slog.LevelWarn, "fleetgate: Redis lost bookings this process had seen (a restart, or a failover to a replica that lacked them): "+
		"the target is held until a horizon and a window (two windows by default) from now, past every slot booked before the loss", tg, now, d)
}

// logHold logs msg for a hold of tg for d, once per hold: not while a hold
// it logged before (*end, unix ns) lasts. Holds of the same cause on many
// targets end together and are logged once; a later one (Redis restarted
// again) is logged again.
func (t *Throttler) logHold(end *atomic.Int64, level slog.Level, msg string, tg *target, now time.Time, d time.Duration) {
	prev := end.Load()
	if now.UnixNano() < prev || !end.CompareAndSwap(prev, now.Add(d).UnixNano()) {
		return
	}
	t.cfg.logger.Log(context.Background(), level, msg, "target", tg.name, "held", d.Round(time.Millisecond))
}

// liveness is how long the store counts a process as live on tg after its
// last mark: the store's liveness (a RedisStore's WithLiveness, else the
// default) for tg's window.
func (t *Throttler) liveness(tg *target) time.Duration { return livenessFor(t.baseLive, tg.lim.Window) }
