package throttle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetgate/fleetgate/lua"
)

// slidingLog runs lua/sliding_log.lua: EVALSHA, and EVAL when the server
// answers NOSCRIPT (after SCRIPT FLUSH or a restart).
var slidingLog = redis.NewScript(lua.SlidingLog)

// ErrBadReply is wrapped when Redis answers the script with a reply of the
// wrong shape (a Redis-compatible server that behaves differently).
var ErrBadReply = errors.New("unexpected reply from the store")

// DefaultKeyPrefix is the prefix of every key a RedisStore writes.
const DefaultKeyPrefix = "fleetgate:"

// RedisStore is the fleet's Store: the logs live in Redis and every decision
// is one atomic run of lua/sliding_log.lua, timed by the Redis server's
// clock. It works with a single node, Sentinel and Cluster alike through
// redis.UniversalClient; each target's keys share one hash tag, so they sit
// in one Cluster slot.
//
// Every key gets a TTL just long enough for its window and reservations, so
// idle targets leave nothing behind. RedisStore is safe for concurrent use.
type RedisStore struct {
	client   redis.UniversalClient
	prefix   string
	proc     string // this process's id: entry names and heartbeat
	procArg  any    // proc, boxed once
	liveness time.Duration
	now      func() int64 // tests only: a fixed server time in µs

	targets sync.Map // target name -> *redisTarget
	count   atomic.Int64
}

// redisTarget is what a RedisStore keeps per target between calls.
type redisTarget struct {
	keys    []string     // log, pause, heartbeat
	trimmed atomic.Int64 // when this process last trimmed the heartbeat (unix ns)
	seen    atomic.Int64 // the latest slot seen in the log (server µs), to notice a lost log
	args    atomic.Pointer[limitArgs]
}

// limitArgs are a Limit's script arguments, boxed once: a target's limit
// rarely changes, and boxing them on every call cost allocations.
type limitArgs struct {
	lim                 Limit
	limit, window, gap  any
	liveness, noTrimmed any // the liveness, positive (trim) and negative (don't)
}

func (rt *redisTarget) limitArgs(lim Limit, liveness time.Duration) *limitArgs {
	if a := rt.args.Load(); a != nil && a.lim == lim {
		return a
	}
	a := &limitArgs{lim: lim, limit: lim.Limit, window: us(lim.Window), gap: us(lim.Gap), liveness: us(liveness), noTrimmed: -us(liveness)}
	rt.args.Store(a)
	return a
}

// trimEvery is how often, at most, a process trims the dead from a
// target's heartbeat set and renews its TTL; every call marks it live.
const trimEvery = time.Second

// RedisOption configures a RedisStore.
type RedisOption func(*RedisStore)

// WithKeyPrefix sets the prefix of every key (default DefaultKeyPrefix). The
// prefix must not contain '{' or '}', which would break the hash tag.
func WithKeyPrefix(p string) RedisOption {
	return func(s *RedisStore) { s.prefix = p }
}

// WithLiveness sets how long a process counts as live on a target after its
// last call (default 10s, and never less than twice the window). The live
// count sets each process's share when the store fails.
func WithLiveness(d time.Duration) RedisOption {
	return func(s *RedisStore) { s.liveness = d }
}

// NewRedisStore returns a store on client. The client stays the caller's:
// Close does not close it. The client must be created with
// ContextTimeoutEnabled set (redis.Options or redis.ClusterOptions), so that
// each store call is bounded by the Throttler's store timeout; NewRedisStore
// refuses one without it.
func NewRedisStore(client redis.UniversalClient, opts ...RedisOption) (*RedisStore, error) {
	if client == nil {
		return nil, errors.New("throttle: NewRedisStore: nil client")
	}
	if !contextTimeouts(client) {
		return nil, errors.New("throttle: NewRedisStore: the client must be created with ContextTimeoutEnabled: true, " +
			"or go-redis ignores the store timeout and a hung Redis holds every waiter for its ReadTimeout")
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	s := &RedisStore{client: client, prefix: DefaultKeyPrefix, proc: hex.EncodeToString(id[:]), liveness: 10 * time.Second}
	for _, o := range opts {
		o(s)
	}
	if strings.ContainsAny(s.prefix, "{}") {
		return nil, fmt.Errorf("throttle: key prefix %q must not contain '{' or '}'", s.prefix)
	}
	if s.liveness <= 0 {
		return nil, fmt.Errorf("throttle: liveness %v must be positive", s.liveness)
	}
	s.procArg = s.proc
	return s, nil
}

// contextTimeouts reports whether client lets a context's deadline bound a
// call. Clients of other types (a Ring, a wrapper) are trusted.
func contextTimeouts(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// Close implements Store; the client is left open.
func (s *RedisStore) Close() error { return nil }

// Process returns this store's process id, as it appears in entry names and
// in the heartbeat.
func (s *RedisStore) Process() string { return s.proc }

// keys returns target's log, pause and heartbeat keys. The target sits
// inside one {hash tag}; braces and '%' in it are escaped so no target can
// end the tag early.
func (s *RedisStore) keys(target string) []string {
	tag := s.prefix + "{" + escapeTag(target) + "}:"
	return []string{tag + "log", tag + "pause", tag + "procs"}
}

func escapeTag(t string) string {
	if !strings.ContainsAny(t, "{}%") {
		return t
	}
	return strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(t)
}

func (s *RedisStore) nowArg() string {
	if s.now != nil {
		return strconv.FormatInt(s.now(), 10)
	}
	return ""
}

func (s *RedisStore) member(id uint64) string {
	if id&SharedEntry != 0 {
		return "shared." + strconv.FormatUint(id&^SharedEntry, 36)
	}
	return s.proc + "." + strconv.FormatUint(id, 36)
}

func us(d time.Duration) int64 { return d.Microseconds() }

func fromUS(v int64) time.Duration { return time.Duration(v) * time.Microsecond }

// Reserve implements Store.
func (s *RedisStore) Reserve(ctx context.Context, target string, lim Limit, reqs []Request, grants []Grant) (State, error) {
	rt := s.target(target)
	liveness := max(s.liveness, 2*lim.Window)
	la := rt.limitArgs(lim, liveness)
	live := la.liveness
	if !rt.trimDue(liveness) {
		live = la.noTrimmed
	}
	args := make([]any, 0, 9+3*len(reqs))
	args = append(args, "reserve", s.nowArg(), la.limit, la.window, la.gap, s.procArg, live, rt.seen.Load(), len(reqs))
	for _, r := range reqs {
		maxWait := int64(-1)
		if r.MaxWait >= 0 {
			maxWait = us(r.MaxWait)
		}
		args = append(args, s.member(r.ID), r.N, maxWait)
	}
	vals, err := s.runKeys(ctx, target, rt.keys, 6+2*len(reqs), args)
	if err != nil {
		return State{}, err
	}
	for i := range reqs {
		grants[i] = Grant{OK: vals[6+2*i] == 1, Delay: fromUS(vals[7+2*i])}
	}
	if reset := vals[2]; reset > 0 { // the log's last entry is now + reset - window
		last := vals[0] + reset - us(lim.Window)
		for prev := rt.seen.Load(); last > prev && !rt.seen.CompareAndSwap(prev, last); prev = rt.seen.Load() {
		}
	}
	return State{
		Remaining:  int(vals[1]),
		ResetAfter: fromUS(vals[2]),
		Live:       int(vals[3]),
		Tail:       fromUS(vals[4]),
		Paused:     fromUS(vals[5]),
	}, nil
}

// target returns target's keys and bookkeeping, made once.
func (s *RedisStore) target(name string) *redisTarget {
	if v, ok := s.targets.Load(name); ok {
		return v.(*redisTarget)
	}
	if n := s.count.Add(1); n > maxRedisTargets && n%maxRedisTargets == 0 {
		s.forget(time.Now().Add(-time.Minute).UnixNano())
	}
	v, _ := s.targets.LoadOrStore(name, &redisTarget{keys: s.keys(name)})
	return v.(*redisTarget)
}

// trimDue reports whether this call should trim rt's heartbeat set, and if
// so records that it does.
func (rt *redisTarget) trimDue(liveness time.Duration) bool {
	now := time.Now().UnixNano()
	prev := rt.trimmed.Load()
	return now-prev >= int64(min(trimEvery, liveness/4)) && rt.trimmed.CompareAndSwap(prev, now)
}

// maxRedisTargets bounds the per-target bookkeeping of a crawl over many
// targets: every maxRedisTargets new targets, those idle for a minute are
// forgotten (and made again if they come back).
const maxRedisTargets = 10_000

func (s *RedisStore) forget(before int64) {
	s.targets.Range(func(k, v any) bool {
		if v.(*redisTarget).trimmed.Load() < before {
			s.targets.Delete(k)
			s.count.Add(-1)
		}
		return true
	})
}

// Cancel implements Store.
func (s *RedisStore) Cancel(ctx context.Context, target string, id uint64, n int) error {
	args := []any{"cancel", s.nowArg()}
	m := s.member(id)
	if n <= 1 {
		args = append(args, m)
	} else {
		for j := 1; j <= n; j++ {
			args = append(args, m+"."+strconv.Itoa(j))
		}
	}
	rt := s.target(target)
	vals, err := s.runKeys(ctx, target, rt.keys, 3, args)
	if err == nil {
		// The log as it is now: emptied by this cancel, it was not lost.
		rt.seen.Store(vals[2])
	}
	return err
}

// Pause implements Store.
func (s *RedisStore) Pause(ctx context.Context, target string, d time.Duration) (time.Duration, error) {
	vals, err := s.run(ctx, target, 2, []any{"pause", s.nowArg(), us(max(d, 0))})
	if err != nil {
		return 0, err
	}
	return fromUS(vals[1]), nil
}

// Restore implements Store.
func (s *RedisStore) Restore(ctx context.Context, target string, window time.Duration, entries []Entry) error {
	args := []any{"restore", s.nowArg(), us(window)}
	for _, e := range entries {
		m := s.member(e.ID)
		if e.N <= 1 {
			args = append(args, m, us(e.Age))
			continue
		}
		for j := 1; j <= e.N; j++ {
			args = append(args, m+"."+strconv.Itoa(j), us(e.Age))
		}
	}
	_, err := s.run(ctx, target, 2, args)
	return err
}

// run executes the script and checks that the reply is an array of at least
// want integers.
func (s *RedisStore) run(ctx context.Context, target string, want int, args []any) ([]int64, error) {
	return s.runKeys(ctx, target, s.target(target).keys, want, args)
}

func (s *RedisStore) runKeys(ctx context.Context, target string, keys []string, want int, args []any) ([]int64, error) {
	op := args[0]
	raw, err := slidingLog.Run(ctx, s.client, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("redis store: %s %q: %w", op, target, err)
	}
	arr, ok := raw.([]any)
	if !ok || len(arr) < want {
		return nil, fmt.Errorf("redis store: %s %q: %w: %T of %d values, want %d integers", op, target, ErrBadReply, raw, len(arr), want)
	}
	vals := make([]int64, len(arr))
	for i, v := range arr {
		n, ok := v.(int64)
		if !ok {
			return nil, fmt.Errorf("redis store: %s %q: %w: value %d is %T, want an integer", op, target, ErrBadReply, i, v)
		}
		vals[i] = n
	}
	return vals, nil
}

// Probe checks that the store answers, on a connection of its own. A pooled
// client can keep failing for a while after Redis is back (dial retries and
// backoff), so a process deciding whether to leave its fallback asks a
// fresh connection instead.
func (s *RedisStore) Probe(ctx context.Context) error {
	switch c := s.client.(type) {
	case *redis.Client:
		return probeFresh(ctx, c.Options())
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return probeFresh(ctx, m.Options())
		})
	}
	return s.client.Ping(ctx).Err()
}

// probeFresh pings through a new one-connection client with opts, without
// retries, and closes it.
func probeFresh(ctx context.Context, opts *redis.Options) error {
	o := *opts
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxRetries = 1, 0, 0, -1
	o.ContextTimeoutEnabled = true
	// A throwaway client must not register maintenance-notification
	// handlers (go-redis logs a failure each time it cannot).
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	fresh := redis.NewClient(&o)
	defer fresh.Close()
	return fresh.Ping(ctx).Err()
}
