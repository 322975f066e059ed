// Package redistest starts real redis-server processes for tests.
//
// StartServer runs a standalone server on a free loopback port, in its own
// temporary directory, with persistence disabled; the test can Kill it and
// Restart it on the same port to exercise reconnects and data loss.
// StartCluster runs three redis-server processes as a Redis Cluster of three
// masters (no replicas) that together own all 16384 hash slots.
// StartSentinel runs a Redis Sentinel that monitors a started server (give
// that one a replica, started with "--replicaof", and killing it makes the
// Sentinel promote the replica).
//
// The helpers never use a mock and never touch a shared server such as
// 127.0.0.1:6379: every test gets its own processes, and KeyPrefix gives
// each test its own key namespace besides. Everything a helper starts, and
// every client it returns, is stopped by a testing.TB Cleanup, also when the
// test fails.
//
// redis-server (and, for StartCluster, redis-cli) must be on PATH. When one
// is missing the helpers fail the test with a message naming the binary and
// how to install it (scripts/install-redis.sh); they never skip the test,
// so a machine without Redis cannot silently pass.
//
// All helpers may be called from parallel tests. Like testing.TB.Fatal,
// they must be called from the goroutine running the test.
package redistest
