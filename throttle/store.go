package throttle

import (
	"context"
	"time"
)

// A Store keeps the sliding-window logs of every target and decides
// admissions atomically. MemoryStore (one process) and RedisStore (a fleet)
// implement it with identical semantics; the conformance tests hold both to
// them. Implementations must be safe for concurrent use.
//
// Times inside a store come from the store's own clock; durations in its
// arguments and results are relative to that clock's "now" at the call.
type Store interface {
	// Reserve decides reqs in order, atomically: each gets the earliest
	// slot at which admitting its units keeps every interval of length
	// lim.Window at or under lim.Limit units, after any pause, after every
	// earlier entry (first come, first served) and at least lim.Gap after
	// the latest one. A request whose slot is further than its MaxWait is
	// refused and writes nothing. grants[i] receives the decision for
	// reqs[i]; len(grants) must be at least len(reqs).
	//
	// On error nothing is known to have been written: the caller treats
	// every request as not granted.
	Reserve(ctx context.Context, target string, lim Limit, reqs []Request, grants []Grant) (State, error)

	// Cancel removes the n units that request id wrote, if they are still
	// there. Cancelling what is gone is not an error.
	Cancel(ctx context.Context, target string, id uint64, n int) error

	// Pause holds every admission for target until now+d; a pause only ever
	// grows, so a shorter one than the current pause changes nothing.
	// Pause(ctx, target, 0) reads the pause. It returns what is left of it.
	Pause(ctx context.Context, target string, d time.Duration) (time.Duration, error)

	// Restore writes entries into target's log as they are, without
	// deciding anything: the admissions a process made while the store was
	// unreachable, and placeholders for other processes' shares. Entries
	// older than window are dropped.
	Restore(ctx context.Context, target string, window time.Duration, entries []Entry) error

	// Close releases what the store owns. A store passed to New with
	// WithStore is closed by its owner, not by the Throttler.
	Close() error
}

// Limit is what a store enforces in one Reserve call: a Rule whose window
// already includes the Throttler's margin.
type Limit struct {
	Limit  int           // units in any interval of length Window
	Window time.Duration // the rule's window plus the margin
	Gap    time.Duration // minimum spacing between admissions; 0 means none
	// Ahead is how far ahead of its now any process of the fleet books a
	// slot at most (the Throttler's horizon, WithMaxAhead); 0 means
	// Window. A RedisStore whose data is younger than Ahead plus Window
	// (Redis restarted empty, or was flushed) holds a target found empty
	// until then: its log may have been lost. A MemoryStore ignores it.
	Ahead time.Duration
}

// Request asks a store for one slot of N units.
type Request struct {
	ID      uint64        // unique among the process's requests; names the entries
	N       int           // units, from 1 to Limit.Limit
	MaxWait time.Duration // the longest acceptable delay; negative means no bound
}

// Grant is a store's decision on one Request.
type Grant struct {
	OK    bool          // the slot was written
	Delay time.Duration // from the store's now to the slot (or, when !OK, to the slot it would have had)
}

// State describes a target's log after a Reserve call.
type State struct {
	Remaining  int           // units the window still has room for, 0 while paused (a gap may still delay them); at most the room there is: a RedisStore may count, in a log kept as a list, entries that expired since it last cut them, which it does once a quarter window
	ResetAfter time.Duration // until the log is empty; 0 when it is already
	Live       int           // processes seen on this target lately, this one included; 0 when the store has no count yet (until the next mark)
	Place      int           // when this call marked the process live: its place among the Live processes, from 1, in an order every process of the fleet learns alike; 0 when the call did not tell. In the FailLocal fallback the processes' shares take turns at the rule's gap by their places; under a Store that never tells, they start together
	Joined     bool          // this call added this process to Live: its first call, or its first since it dropped out (the others' counts may lack it); a MemoryStore, one process alone, never sets it, and a Store that counts processes but never sets it makes a process that came back count as one of long standing in the fallback
	Tail       time.Duration // until the latest entry's slot; 0 when none is in the future
	Paused     time.Duration // what is left of the pause; 0 when there is none
	Young      bool          // the pause is a RedisStore's hold on a target found empty while the store's data is young (see Limit.Ahead)
	Lost       bool          // the pause is a RedisStore's hold on a target whose log, or its latest entries, Redis lost: this call noticed
}

// Entry is one log entry for Restore: request ID's N units at the store's
// now minus Age (a negative Age is a future slot).
type Entry struct {
	ID  uint64
	N   int
	Age time.Duration
}

// SharedEntry marks the ID of a placeholder that every process names alike:
// in a RedisStore, the same placeholder restored by several processes is one
// entry, not one per process.
const SharedEntry uint64 = 1 << 63
