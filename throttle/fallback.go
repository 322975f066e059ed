package throttle

import (
	"context"
	"time"
)

// prober is implemented by stores that can check their health on a fresh
// connection (RedisStore).
type prober interface {
	Probe(ctx context.Context) error
}

func (tg *target) isDegraded() bool {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.degraded
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
		seed := []Entry{{ID: nextID(), N: share.Limit, Age: -ahead}}
		_ = t.local.Restore(context.Background(), tg.name, share.Window, seed)
	}
	tg.degraded, tg.probed = true, now
	tg.mu.Unlock()
	if t.degraded.Add(1) == 1 {
		t.cfg.logger.Warn("fleetgate: store failed; deciding by the failure policy",
			"policy", t.cfg.policy.String(), "target", tg.name, "error", cause)
	}
}

// degradedNow returns nil when tg should be decided by the store: it is not
// degraded, or it was and the store is back (after replaying what this
// process admitted locally). It probes at most once per probe interval.
func (tg *target) degradedNow(t *Throttler) error {
	now := t.cfg.now()
	tg.mu.Lock()
	if !tg.degraded {
		tg.mu.Unlock()
		return nil
	}
	if now.Sub(tg.probed) < t.cfg.probeInterval {
		tg.mu.Unlock()
		return errStoreDown
	}
	tg.probed = now
	live := tg.live
	tg.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.storeTimeout)
	defer cancel()
	if p, ok := t.store.(prober); ok {
		if err := p.Probe(ctx); err != nil {
			return err
		}
	}
	var entries []Entry
	if t.cfg.policy == FailLocal {
		// What this process admitted locally, then placeholders for the
		// shares of the others, dated ahead by the grace they may take to
		// notice the store is back.
		share, _ := t.share(tg)
		entries = t.local.entries(tg.name, tg.lim.Window)
		if others := (live - 1) * share.Limit; others > 0 {
			entries = append(entries, Entry{ID: nextID(), N: min(others, tg.lim.Limit), Age: -t.cfg.grace})
		}
	}
	if err := t.store.Restore(ctx, tg.name, tg.lim.Window, entries); err != nil {
		return err
	}
	tg.mu.Lock()
	tg.degraded = false
	tg.mu.Unlock()
	if t.degraded.Add(-1) == 0 {
		t.cfg.logger.Info("fleetgate: store is back; deciding by the store again", "target", tg.name)
	}
	return nil
}

// horizon is how far ahead the store may book for tg.
func (t *Throttler) horizon(tg *target) time.Duration {
	if t.cfg.maxAhead > 0 {
		return t.cfg.maxAhead
	}
	return tg.lim.Window
}

// share is this process's part of tg's limit while the store is down: N
// divided by the live processes, or, when there are more processes than
// units, one unit per proportionally longer window. known is false when the
// store never told this process how many share the target: then no share is
// safe, and the process waits for the store.
func (t *Throttler) share(tg *target) (l Limit, known bool) {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.shareLocked(), tg.live > 0
}

func (tg *target) shareLocked() Limit {
	live := max(tg.live, 1)
	l := tg.lim
	if live == 1 {
		return l
	}
	if l.Limit >= live {
		return Limit{Limit: l.Limit / live, Window: l.Window, Gap: l.Gap * time.Duration(live)}
	}
	w := (l.Window*time.Duration(live) + time.Duration(l.Limit) - 1) / time.Duration(l.Limit)
	return Limit{Limit: 1, Window: w, Gap: l.Gap * time.Duration(live)}
}
