// Package lua holds the Redis script behind fleetgate's fleet-wide quota.
//
// The script is plain text embedded at build time, so the Redis store, the
// tests and anyone reading it share one copy. Its header documents its keys,
// arguments and replies; package throttle is its only intended caller.
package lua

import _ "embed"

// SlidingLog is the source of sliding_log.lua: the atomic sliding-window log
// with reservations, a fleet-wide pause and a process heartbeat.
//
//go:embed sliding_log.lua
var SlidingLog string
