// Package throttle keeps a whole fleet of workers under each target's rate
// limit.
//
// Every process that shares a Store shares one quota per target (a host, a
// registrable domain or an IP). Wait blocks until the fleet may send one more
// request without exceeding the target's Rule; Allow decides without
// waiting; ReserveN books a slot that can be cancelled; Pause holds the
// whole fleet back from a target, for example after a 429.
//
// # The guarantee
//
// The quota is a sliding-window log, not a token bucket: for every target,
// across all processes sharing the store, the number of admitted units in
// ANY interval of length Window+margin is at most Limit, counted at their
// slots on the store's clock. A token bucket or GCRA configured "N per W"
// lets up to 2N-1 requests into one window, which is what gets a fleet
// banned; the log never does. The margin (DefaultMargin) absorbs the spread
// between a slot and the request's arrival at the target (a caller's wake-up
// comes a little after its slot), so that the target sees at most Limit in
// any Window. The
// guarantee is the store's: across a store failure it is kept as far as the
// FailurePolicy can (see FailLocal for what it cannot see).
//
// # Reservations, not polling
//
// When a window is full the store books the earliest slot that keeps the
// guarantee (first come, first served) and Wait sleeps exactly until then,
// holding no lock. At most one store call per admission in steady state;
// concurrent waiters of one process on one target share a call. Bookings
// reach at most one window ahead (WithMaxAhead); a waiter further back
// sleeps until its slot comes within reach. If the context ends
// first, the slot is released; if the slot lies past the context's deadline,
// nothing is booked and the error matches context.DeadlineExceeded.
//
// # Stores
//
// MemoryStore is the default, for one process. RedisStore runs one atomic
// Lua script (package lua) per decision on Redis, single node, Sentinel or
// Cluster, timed by the Redis server's clock so workers with skewed clocks
// share one timeline. When the store fails, the FailurePolicy decides:
// FailLocal (the default) falls back to this process's share of the limit.
package throttle
