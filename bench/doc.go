// Package bench measures fleetgate against its peers: decisions per second on
// a local Redis beside github.com/go-redis/redis_rate/v10, store calls per
// admission under contention, the memory store beside
// golang.org/x/time/rate, and how memory and decision cost grow with the log
// and the number of targets.
//
// It is a module of its own so that the library does not depend on the
// libraries it is compared with. Everything is in _test.go files; run it
// with
//
//	cd bench && go test -run '^$' -bench . -benchmem -count 1 -timeout 30m
//
// The Redis benchmarks start their own redis-server on a free loopback port
// (never the machine's shared 6379) and fail if redis-server is not on PATH.
// BENCHMARKS.md at the repository root holds the figures and their analysis.
package bench
