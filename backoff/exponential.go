package backoff

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Defaults for the zero fields of an [Exponential].
const (
	defaultBase       = 100 * time.Millisecond
	defaultMultiplier = 2
	defaultMax        = 30 * time.Second
)

// randMu serializes draws from every caller-supplied *rand.Rand, so that
// Exponentials sharing one Rand are safe for concurrent use too.
var randMu sync.Mutex

// Jitter selects how [Exponential.Delay] randomizes a delay. Below, d is
// the exponential delay Base*Multiplier^retry, capped at Max.
type Jitter int

const (
	// FullJitter draws the delay uniformly from [0, d]. It spreads a
	// fleet's retries the most; it is the zero value, and any value that
	// is not one of these constants behaves like it.
	FullJitter Jitter = iota
	// EqualJitter draws the delay uniformly from [d/2, d], so at least
	// half of d is always waited.
	EqualJitter
	// DecorrelatedJitter draws the delay uniformly from [Base, 3*prev] and
	// caps it at Max, where prev is the previous delay raised to at least
	// Base. It ignores the retry number: each delay grows from the last.
	DecorrelatedJitter
	// NoJitter returns d exactly. Clients that share it retry in lockstep,
	// so use it for a single client or for tests.
	NoJitter
)

// Exponential computes exponential backoff delays with jitter.
//
// The zero value is ready to use: a 100ms base doubling per retry, capped
// at 30s, with full jitter drawn from the global source. An Exponential
// keeps no state between calls, so it is safe for concurrent use and may
// be copied, as long as its fields are not changed while it is in use.
type Exponential struct {
	// Base is the delay before retry 0, before jitter, and the least
	// delay DecorrelatedJitter returns. Zero or negative means 100ms.
	Base time.Duration
	// Multiplier is the factor the delay grows by per retry. Zero means 2;
	// other values below 1, and NaN, mean 1 (a constant delay).
	Multiplier float64
	// Max caps every delay: Delay never returns more. Zero or negative
	// means 30s.
	Max time.Duration
	// Jitter selects the randomization; the zero value is FullJitter.
	Jitter Jitter
	// Rand is the source of jitter. Nil means the global source of
	// math/rand/v2. A seeded source such as rand.New(rand.NewPCG(1, 2))
	// makes the sequence of delays reproducible.
	//
	// A *rand.Rand is not safe for concurrent use, so Delay draws from it
	// under a package-wide mutex: Exponentials are safe for concurrent
	// use even when they share one Rand. Code outside this package must
	// not draw from that Rand while a Delay call may be running.
	Rand *rand.Rand
}

// Delay returns how long to wait before retry number retry: 0 for the
// first retry, negative counts as 0. prev is the delay Delay returned for
// the previous retry, 0 the first time; only DecorrelatedJitter uses it.
//
// The result is always in [0, Max]. It never overflows: once
// Base*Multiplier^retry passes Max, however large retry is, the delay is
// jittered below Max as if the exponential delay were Max.
func (e *Exponential) Delay(retry int, prev time.Duration) time.Duration {
	switch e.Jitter {
	case NoJitter:
		return e.ceiling(retry)
	case EqualJitter:
		d := e.ceiling(retry)
		return e.between(d/2, d)
	case DecorrelatedJitter:
		base, limit := e.bounds()
		lo := min(base, limit)
		prev = min(max(prev, lo), limit)
		hi := time.Duration(math.MaxInt64)
		if prev <= math.MaxInt64/3 {
			hi = 3 * prev
		}
		return min(e.between(lo, hi), limit)
	default:
		return e.between(0, e.ceiling(retry))
	}
}

// bounds returns Base and Max with their defaults applied.
func (e *Exponential) bounds() (base, limit time.Duration) {
	base, limit = e.Base, e.Max
	if base <= 0 {
		base = defaultBase
	}
	if limit <= 0 {
		limit = defaultMax
	}
	return base, limit
}

// ceiling returns Base*Multiplier^retry capped at Max, computed in
// floating point so that it cannot overflow.
func (e *Exponential) ceiling(retry int) time.Duration {
	base, limit := e.bounds()
	m := e.Multiplier
	switch {
	case m == 0:
		m = defaultMultiplier
	case !(m >= 1): // also NaN
		m = 1
	}
	d := float64(base) * math.Pow(m, float64(max(retry, 0)))
	if d >= float64(limit) { // also +Inf
		return limit
	}
	return time.Duration(d)
}

// between returns a uniform draw from [lo, hi]; it requires 0 <= lo <= hi.
func (e *Exponential) between(lo, hi time.Duration) time.Duration {
	n := uint64(hi-lo) + 1 // at most 2^63: cannot overflow
	if e.Rand == nil {
		return lo + time.Duration(rand.Uint64N(n))
	}
	randMu.Lock()
	r := e.Rand.Uint64N(n)
	randMu.Unlock()
	return lo + time.Duration(r)
}
