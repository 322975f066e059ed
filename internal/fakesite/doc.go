// Package fakesite plays a target site for tests and demos: it enforces its
// own strict rate limit, the way real sites do, and counts every request it
// receives.
//
// A Site is an http.Handler. Its limit is a sliding window kept per client
// (by remote IP): a request is over the limit when, counting it, more than
// Limit requests of that client arrived in the closed interval of length
// Window that ends at it. Over the limit, the site either bans the client
// for the rest of its life (every later request gets 403 Forbidden) or
// answers 429 Too Many Requests, with a Retry-After when configured.
//
// Stats reports what the site saw, including every arrival time, so a test
// can check with Peak that a fleet never exceeded the limit, and a chart can
// plot PerTick. A Site keeps every arrival in memory: it is meant for runs of
// minutes, not days.
package fakesite
