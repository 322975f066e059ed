package throttle

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetgate/fleetgate/lua"
)

// script is a Lua script and the SHA1 that EVALSHA names it by.
type script struct{ src, sha string }

func newScript(src string) script {
	sum := sha1.Sum([]byte(src))
	return script{src: src, sha: hex.EncodeToString(sum[:])}
}

// slidingLog is lua/sliding_log.lua.
var slidingLog = newScript(lua.SlidingLog)

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
// A target's log holds, in slot order, one entry (about 26 bytes) per
// admitted unit still in its window or booked ahead. Up to 64 entries live
// in the target's meta key, with its pause and live count, where a
// decision reads and writes them in the one GET and SET it makes anyway;
// a longer log is a Redis list of its own. Every key
// gets a TTL long enough for its window and reservations, so idle targets
// leave nothing behind: a log lasts at least a window and a spare (half
// the window, at least 0.5 s, at most 30 s) past its last entry, so
// processes whose margins differ by up to a spare may share a target. A
// write renews the TTL, to a window and three spares, only when less is
// left than a window and a spare, so that writes seldom renew it.
//
// Redis that loses its data (an empty restart, a flush) loses the logs
// with it, and a replica promoted before it had the latest writes lacks
// them. A process that saw a target's log notices (an empty log, or one
// that ends before the latest slot it saw, which no cancel took) and holds
// the target until a window after the horizon (Limit.Ahead) from then:
// past every slot any process could have booked before the loss. A process
// that did not see the log cannot tell a lost log from an
// unused one; so the store keeps one more key per node (per slot on a
// Cluster) with the time its data began, set by the first decision that
// finds it missing and kept a day, renewed while targets are in use (on a
// Cluster, a goroutine makes and renews every slot's, from the first
// decision and then hourly, until Close), and while the data is younger
// than a horizon (Limit.Ahead) and a window, a target found empty is held
// until then. A fresh Redis holds each target that long once.
//
// It needs Redis 6.0 or later. RedisStore is safe for concurrent use.
type RedisStore struct {
	client    redis.UniversalClient
	prefix    string
	proc      string // this process's id: entry names and heartbeat
	procArg   any    // proc, boxed once (another release's script takes it so)
	procNum   int64  // proc as a number: 12 hex digits
	liveness  time.Duration
	now       func() int64   // tests only: a fixed server time in µs
	inlineMax string         // how many entries a log keeps inline ("0": none, WithListLogs; other values: tests)
	ops       map[string]any // op names with inlineMax, made by NewRedisStore
	script    *script        // tests only: another release's script, which takes a reserve's arguments as 958864a did
	readEpoch bool           // tests only: with a fixed time, read the epoch key too (else the data counts as old)
	oldData   bool           // tests only: the data counts as old, with the real time too
	epochArg  any            // the epoch key of a run of many targets (a single node)
	ahead     atomic.Int64   // the latest Limit.Ahead a Reserve passed, µs: a Restore's for a target with none

	born time.Time // the local monotonic clock's origin for redisTarget.clock

	passwords []string // the client's, taken out of every error's text (passwordsOf)

	targets sync.Map // target name -> *redisTarget
	count   atomic.Int64

	batch  atomic.Bool               // Reserve calls of any targets share script runs (single node)
	warmed atomic.Bool               // a Probe has readied the client (see warm)
	calls  groupCommit[*reserveCall] // the shared runs

	keeper    sync.Once     // starts keepEpochs, on a store that does not batch
	stop      chan struct{} // closed by Close: keepEpochs returns
	keeperRun chan struct{} // closed when keepEpochs has returned (nil: never started)
	closing   sync.Once
}

// redisTarget is what a RedisStore keeps per target between calls.
type redisTarget struct {
	keys    []string            // log, pause (with the live count), heartbeat
	keyArgs []any               // keys, boxed once for the script's arguments
	epoch   atomic.Pointer[any] // the epoch key of the target's Cluster slot, once needed
	marked  atomic.Int64        // when this process last marked itself live here (unix ns)
	used    atomic.Int64        // when this process last called Reserve here (unix ns)
	// seen is the latest slot seen in the log (server µs), to notice a
	// lost log, times four; plus one while a booking of this process's
	// own, not cancelled since, is at that slot; plus two once this
	// process cancelled a booking of its own while one was there (see
	// sawLast).
	seen atomic.Int64
	full atomic.Bool // the latest decision found the window full: the script reads the log's tail first
	args atomic.Pointer[limitArgs]
	// clock is the server's clock, as the latest reply for the target told
	// it, less the local monotonic clock (µs since RedisStore.born) at that
	// reply's send; 0 before any. A target's keys live on one server, so
	// on a Cluster too it is that server's clock (or, after a failover, its
	// old master's until the next reply). A booking's check reckons from it
	// when it goes stale.
	clock atomic.Int64
}

// limitArgs are the first numbers of a reserve block for a Limit (limit,
// window, gap and the heartbeat), encoded once: a target's limit rarely
// changes.
type limitArgs struct {
	lim              Limit
	heartbeat, quiet []byte // the liveness, positive (mark, trim and count) and negative (read the stored count)
}

func (rt *redisTarget) limitArgs(lim Limit, liveness time.Duration) *limitArgs {
	if a := rt.args.Load(); a != nil && a.lim == lim {
		return a
	}
	head := appendNums(nil, int64(lim.Limit), us(lim.Window), us(lim.Gap), us(lim.Ahead))
	a := &limitArgs{
		lim:       lim,
		heartbeat: appendNums(slices.Clip(head), us(liveness)),
		quiet:     appendNums(slices.Clip(head), -us(liveness)),
	}
	rt.args.Store(a)
	return a
}

// appendNums appends vs to b as the script reads a reserve's numbers: each
// an 8-byte big-endian signed integer.
func appendNums(b []byte, vs ...int64) []byte {
	for _, v := range vs {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// RedisOption configures a RedisStore.
type RedisOption func(*RedisStore)

// WithKeyPrefix sets the prefix of every key (default DefaultKeyPrefix). The
// prefix must not contain '{' or '}', which would break the hash tag.
func WithKeyPrefix(p string) RedisOption {
	return func(s *RedisStore) { s.prefix = p }
}

// WithLiveness sets how long a process counts as live on a target after its
// last call (default 10s, and never less than four windows; a process
// marks itself live on its first call for a target and then every quarter
// of the liveness at most, so the count may keep it a quarter less). Every
// call reads the live count stored by the latest mark of any process, which
// sets each process's share when the store fails.
func WithLiveness(d time.Duration) RedisOption {
	return func(s *RedisStore) { s.liveness = d }
}

// WithListLogs keeps every log in a Redis list, and each target's meta in
// the 32-byte form of releases before short logs moved into it, so that
// processes of such a release can share the store during a rolling
// upgrade. Such a process neither sees a short log kept in meta nor keeps
// one when it rewrites meta: a fleet where it meets processes that keep
// short logs admits more than the limit. So upgrade in two steps: every
// process with WithListLogs first, then, once no process of the earlier
// release is left, every process without it. A process with WithListLogs
// reads and keeps the short logs of processes without it, so the second
// step may roll too. Decisions over short logs cost the Redis server more
// with it (BENCHMARKS.md).
func WithListLogs() RedisOption {
	return func(s *RedisStore) { s.inlineMax = "0" }
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
	s := &RedisStore{client: client, prefix: DefaultKeyPrefix, proc: hex.EncodeToString(id[:]), liveness: defaultLiveness, born: time.Now()}
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
	s.passwords = passwordsOf(client)
	s.procNum = int64(binary.BigEndian.Uint64(append(make([]byte, 2, 8), id[:]...)))
	s.epochArg = s.prefix + "epoch"
	if s.inlineMax != "" {
		s.ops = make(map[string]any)
		for _, name := range []string{"reserve", "cancel", "pause", "restore", "epoch"} {
			s.ops[name] = s.fullOp(name)
		}
	}
	s.calls = groupCommit[*reserveCall]{lanes: storeLanes, max: maxStoreBatch}
	s.stop = make(chan struct{})
	// A script may touch keys of many slots on a single node, not on a
	// Cluster (nor a Ring, whose shards split targets too).
	_, single := client.(*redis.Client)
	s.batch.Store(single)
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

// Close implements Store: it stops the store's upkeep of the epoch keys on
// a Cluster, and waits for it (a pass in flight on a node that does not
// answer ends at its own timeout; Close waits a second at most). The client
// is left open.
func (s *RedisStore) Close() error {
	s.closing.Do(func() {
		close(s.stop)
		s.keeper.Do(func() {}) // none starts from now on
	})
	if s.keeperRun != nil {
		select {
		case <-s.keeperRun:
		case <-time.After(time.Second):
		}
	}
	return nil
}

// epochEvery is how often a store on a Cluster makes and renews the epoch
// key of every slot; epochRetry how soon it tries again the keys a pass
// failed on. The keys last a day and are renewed once less than half of
// that is left. Each wait is longer by up to a tenth, at random, so that a
// fleet started together spreads its passes.
const (
	epochEvery = time.Hour
	epochRetry = time.Minute
)

// A pass over the epoch keys goes epochChunk keys at a time (one pipeline
// each, split by node), epochPause apart. All 16,384 in one go, at a
// store's first decision, held the nodes so long that the first decisions
// queued behind them missed the store timeout: four crawlers starting
// together on a three-node Cluster fell back at once in every run on an
// idle machine, and in none of nine with the pass paced (see also
// epochFirst).
const (
	epochChunk = 256
	epochPause = 5 * time.Millisecond
)

// epochFirst is how long a store on a Cluster waits, at least (and at most
// twice that), before its first pass over the epoch keys; epochTTL is the
// keys' TTL, the script's EPOCH_TTL: a key with more than half of it left
// needs no pass.
const (
	epochFirst = 500 * time.Millisecond
	epochTTL   = 24 * time.Hour
)

// keepsEpochs reports whether the store should keep every slot's epoch key:
// on a Cluster, or through a plain client on a node in cluster mode (it no
// longer batches). A Ring routes a slot's key to another shard than the
// targets whose script runs read it, so there it would do nothing useful.
func (s *RedisStore) keepsEpochs() bool {
	switch s.client.(type) {
	case *redis.ClusterClient:
		return true
	case *redis.Client:
		return !s.batch.Load()
	}
	return false
}

// keepEpochs makes and renews every slot's epoch key, at once and then
// every epochEvery, until Close; keys a pass failed on (a node down) are
// tried again after epochRetry. A key made only when first read would hold
// the first target of every slot as if the data were young.
func (s *RedisStore) keepEpochs() {
	defer close(s.keeperRun)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // Close ends a pass in flight
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	all := s.slotEpochKeys()
	// The first pass waits a moment, at random: processes started together
	// would otherwise all run it while their first decisions queue behind
	// it on the nodes.
	select {
	case <-s.stop:
		return
	case <-time.After(epochFirst + time.Duration(mrand.Int64N(int64(epochFirst)))):
	}
	keys := all
	for {
		keys = s.renewEpochsPaced(ctx, keys)
		if ctx.Err() != nil {
			return
		}
		wait := epochRetry
		if len(keys) == 0 {
			keys, wait = all, epochEvery
		}
		wait += time.Duration(mrand.Int64N(int64(wait / 10)))
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
	}
}

// slotEpochKeys returns the epoch key of every Cluster slot, by slot.
func (s *RedisStore) slotEpochKeys() []string {
	all := make([]string, slots)
	for sl := range all {
		all[sl] = s.slotEpochKey(sl)
	}
	return all
}

// renewEpochsPaced renews keys epochChunk at a time, epochPause apart (see
// epochChunk), within 30 s in all, and returns the keys it failed on or
// did not reach before then or before ctx ended.
func (s *RedisStore) renewEpochsPaced(ctx context.Context, keys []string) []string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var failed []string
	for i := 0; i < len(keys); i += epochChunk {
		if i > 0 {
			select {
			case <-ctx.Done():
				return append(failed, keys[i:]...)
			case <-time.After(epochPause):
			}
		}
		failed = append(failed, s.renewEpochs(ctx, keys[i:min(i+epochChunk, len(keys))])...)
	}
	return failed
}

// epochsDue returns those of keys a pass must run the script's epoch op
// on: missing, without a TTL, or with less than half of epochTTL left; and
// those it could not tell. It asks PTTL of each, in a pipeline (split by
// node on a Cluster): a fraction of a script run's cost, so that the passes
// of many processes over keys that one of them renewed cost little.
func (s *RedisStore) epochsDue(ctx context.Context, keys []string) (due, unknown []string) {
	cmds, _ := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.PTTL(ctx, k)
		}
		return nil
	})
	for i, c := range cmds {
		ttl, err := c.(*redis.DurationCmd).Result()
		switch {
		case err != nil:
			unknown = append(unknown, keys[i])
		case ttl < epochTTL/2: // -1 (no TTL) and -2 (missing) too
			due = append(due, keys[i])
		}
	}
	if len(cmds) < len(keys) { // the pipeline failed as a whole
		unknown = append(unknown, keys[len(cmds):]...)
	}
	return due, unknown
}

// renewEpochs runs the script's epoch op on those of keys that are due
// (epochsDue), one call each, in a pipeline (split by node on a Cluster),
// with EVAL for those whose node lacks the script, and returns the keys it
// failed on.
func (s *RedisStore) renewEpochs(ctx context.Context, keys []string) []string {
	keys, unknown := s.epochsDue(ctx, keys)
	if len(keys) == 0 {
		return unknown
	}
	run := func(keys []string, eval bool) (failed, noScript []string) {
		cmds, _ := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				if eval {
					p.Eval(ctx, slidingLog.src, []string{k}, "epoch")
				} else {
					p.EvalSha(ctx, slidingLog.sha, []string{k}, "epoch")
				}
			}
			return nil
		})
		for i, c := range cmds {
			switch err := c.Err(); {
			case err == nil:
			case !eval && redis.HasErrorPrefix(err, "NOSCRIPT"):
				noScript = append(noScript, keys[i])
			default:
				failed = append(failed, keys[i])
			}
		}
		if len(cmds) < len(keys) { // the pipeline failed as a whole
			failed = append(failed, keys[len(cmds):]...)
		}
		return failed, noScript
	}
	failed, noScript := run(keys, false)
	failed = append(failed, unknown...)
	// EVAL of one key loads the script on its node (sending the script's
	// text with every key would send megabytes); then EVALSHA again. Each
	// round loads it on one more node.
	for round := 0; len(noScript) > 0; round++ {
		f, _ := run(noScript[:1], true)
		rest := noScript[1:]
		if len(f) > 0 || round == 16 {
			return append(append(failed, f...), rest...)
		}
		var f2 []string
		f2, noScript = run(rest, false)
		failed = append(failed, f2...)
	}
	return failed
}

// Process returns this store's process id, as it appears in entry names and
// in the heartbeat.
func (s *RedisStore) Process() string { return s.proc }

// keys returns target's log, pause (the pause and the live count) and
// heartbeat keys. The target sits inside one {hash tag}; braces and '%' in
// it are escaped so no target can end the tag early.
func (s *RedisStore) keys(target string) []string {
	tag := s.prefix + "{" + escapeTag(target) + "}:"
	return []string{tag + "log", tag + "pause", tag + "procs"}
}

// epochKey returns the key of the store's epoch in target's Cluster slot.
// On a single node one key, epochArg, serves every target.
func (s *RedisStore) epochKey(target string) string {
	return s.slotEpochKey(slot(escapeTag(target)))
}

// slotEpochKey returns the key of the store's epoch in Cluster slot sl.
func (s *RedisStore) slotEpochKey(sl int) string {
	return s.prefix + "{" + slotTag(sl) + "}:epoch"
}

func escapeTag(t string) string {
	if !strings.ContainsAny(t, "{}%") {
		return t
	}
	return strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(t)
}

// op returns the script's first argument for op: its name, with the inline
// maximum after a '/' (WithListLogs, or a test), and the time after an '@'
// when a test fixes it. It is small enough to be inlined, so
// that a constant name goes into the arguments without an allocation.
func (s *RedisStore) op(name string) any {
	if s.namedOps() {
		return s.otherOp(name)
	}
	return name
}

// namedOps reports whether a reserve names its op: only when it carries
// more than the name (the inline maximum, a test's time or epoch).
// Otherwise the script takes a reserve's arguments without one.
func (s *RedisStore) namedOps() bool { return s.now != nil || s.inlineMax != "" || s.oldData }

// otherOp returns op's argument with the inline maximum after a '/'
// (WithListLogs: made once, by NewRedisStore) or a test's fixed time.
func (s *RedisStore) otherOp(name string) any {
	if op, ok := s.ops[name]; ok && s.now == nil {
		return op
	}
	return s.fullOp(name)
}

// theScript is the script the store runs: lua/sliding_log.lua, or in a
// test another release's.
func (s *RedisStore) theScript() script {
	if s.script != nil {
		return *s.script
	}
	return slidingLog
}

// fullOp returns op's argument with the test's fixed time after an '@', the
// inline maximum after a '/', and with a fixed time the epoch 0 after a '#'
// (the store's data is old) unless the test reads the epoch key, as far as
// they are set.
func (s *RedisStore) fullOp(name string) string {
	if s.now != nil {
		name += "@" + strconv.FormatInt(s.now(), 10)
	}
	if s.inlineMax != "" {
		name += "/" + s.inlineMax
	}
	if (s.now != nil || s.oldData) && !s.readEpoch && s.script == nil {
		name += "#0"
	}
	return name
}

func (s *RedisStore) member(id uint64) string { return string(s.appendMember(nil, id)) }

// appendMember appends to b the member of entry id: this process's id and
// id in base 36, or for a shared entry "shared." and its number.
func (s *RedisStore) appendMember(b []byte, id uint64) []byte {
	if id&SharedEntry != 0 {
		return strconv.AppendUint(append(b, "shared."...), id&^SharedEntry, 36)
	}
	return strconv.AppendUint(append(append(b, s.proc...), '.'), id, 36)
}

// maxMember is the most bytes appendMember appends.
func (s *RedisStore) maxMember() int { return max(len(s.proc)+1, len("shared.")) + 13 }

func us(d time.Duration) int64 { return d.Microseconds() }

func fromUS(v int64) time.Duration { return time.Duration(v) * time.Microsecond }

// Reserve implements Store. On a single node (a *redis.Client, Sentinel
// included), concurrent Reserve calls for any targets share script runs:
// while a few runs are in flight, newcomers queue and go together in the
// next, one atomic run deciding each target in turn; a call of more than
// 50 units, whose run is long, has a run of its own. On a Cluster each
// target has a run of its own.
func (s *RedisStore) Reserve(ctx context.Context, target string, lim Limit, reqs []Request, grants []Grant) (State, error) {
	if lim.Limit < 1 || lim.Window < time.Microsecond || lim.Gap < 0 {
		// Checked here, not only by the script: in a shared run one bad
		// block would fail every target in it.
		return State{}, fmt.Errorf("redis store: reserve %q: bad limit %d per %v, gap %v", target, lim.Limit, lim.Window, lim.Gap)
	}
	c := &reserveCall{ctx: ctx, entered: time.Now(), rt: s.target(target), target: target, lim: lim, reqs: reqs, grants: grants[:len(reqs)]}
	c.rt.used.Store(c.entered.UnixNano())
	switch {
	case !s.batch.Load():
		s.keeper.Do(func() {
			if s.keepsEpochs() {
				s.keeperRun = make(chan struct{})
				go s.keepEpochs()
			}
		})
		s.reserve([]*reserveCall{c})
	case unitsOf(reqs) > sharedUnits:
		// A long run, maybe under a long deadline (a run takes its
		// callers' latest): alone, it holds up no other target's call.
		s.reserve([]*reserveCall{c})
	case !s.calls.do(ctx, c, s.reserve, failCalls):
		return State{}, fmt.Errorf("redis store: reserve %q: %w", target, ctxError(ctx))
	}
	if c.err != nil {
		return State{}, c.err
	}
	// The caller takes the store's "now" for the middle of its call, which
	// began before this one. The run was sent later, by a wait in the
	// queue, a yield or a retry: every duration grows by half that delay,
	// so that no slot is placed earlier than it is. (A fixed test clock has
	// no round trip to correct.)
	if late := c.sent.Sub(c.entered) / 2; late > 0 && s.now == nil {
		for i := range c.grants {
			c.grants[i].Delay += late
		}
		if c.state.ResetAfter > 0 {
			c.state.ResetAfter += late
		}
		if c.state.Tail > 0 {
			c.state.Tail += late
		}
		if c.state.Paused > 0 {
			c.state.Paused += late
		}
	}
	return c.state, nil
}

// sharedUnits is the most units a store call may carry and still share: a
// RedisStore's script run with other calls, a Throttler's deadline with
// other store calls (perUnitTimeout). A run writes a log entry per unit.
const sharedUnits = 50

// unitsOf returns the units reqs carry.
func unitsOf(reqs []Request) int {
	n := 0
	for _, r := range reqs {
		n += r.N
	}
	return n
}

// reserveCall is one Reserve on its way to the script.
type reserveCall struct {
	ctx     context.Context // the caller's: a run is bounded by its members' deadlines
	entered time.Time       // when Reserve was called
	rt      *redisTarget
	target  string
	lim     Limit
	reqs    []Request

	marking int64     // the heartbeat this call sends (unix ns), 0 if none
	sent    time.Time // when the run that decided it was sent
	grants  []Grant   // the caller's, written before ready is closed
	state   State
	err     error
	commitLink[*reserveCall]
}

func (c *reserveCall) link() *commitLink[*reserveCall] { return &c.commitLink }

// failCalls records a run's panic for the calls it carried.
func failCalls(calls []*reserveCall, err error) {
	for _, c := range calls {
		c.err = fmt.Errorf("redis store: reserve %q: script run %w", c.target, err)
	}
}

// storeLanes is how many script runs a batching RedisStore keeps in flight,
// maxStoreBatch how many Reserve calls one run carries at most. Measured on
// two cores (BENCHMARKS.md), 8 goroutines over 1,000 targets: one lane left
// Redis idle while a run's callers woke up; two and four made as many
// decisions per second, two with half the runs.
const (
	storeLanes    = 2
	maxStoreBatch = 64
)

// reserve decides calls in one script run and fills in their results. A
// call whose context has ended is not sent; the run is bounded by the
// latest deadline among the others, so that a member near its own deadline
// does not fail the rest.
func (s *RedisStore) reserve(calls []*reserveCall) {
	// send: the calls whose context is live; calls itself (not copied, and
	// not changed in place: the caller's batch) while every one is.
	send, copied := calls, false
	var ctx context.Context
	var latest time.Time
	for i, c := range calls {
		if err := c.ctx.Err(); err != nil {
			c.err = fmt.Errorf("redis store: reserve %q: %w", c.target, ctxError(c.ctx))
			if !copied {
				send, copied = slices.Clone(calls[:i]), true
			}
			continue
		}
		d, ok := c.ctx.Deadline()
		if ctx == nil || !ok || (!latest.IsZero() && d.After(latest)) {
			ctx, latest = c.ctx, d
		}
		if copied {
			send = append(send, c)
		}
	}
	batching := s.batch.Load() // once: another run may turn it off meanwhile
	switch {
	case len(send) == 0:
		return
	case len(send) > 1 && !batching: // turned off since the batch formed
		for _, c := range send {
			s.reserve([]*reserveCall{c})
		}
		return
	}
	calls = send
	// When the run is sent, give or take the microsecond that building its
	// arguments takes; it also dates the heartbeat marks.
	sent := time.Now()
	for _, c := range calls {
		c.sent = sent
	}

	// The epoch key last: on a single node one for every target, else the
	// one in the target's slot. (Another release's script takes none.)
	legacy := s.script != nil
	global := !legacy && batching // the run carries the node's epoch key
	// lead: the arguments before the first block: none, the op, or (for
	// another release's script) the op and the process's id.
	nkeys, lead, nbytes := 1, 0, 0
	switch {
	case legacy:
		nkeys, lead = 0, 2
	case s.namedOps():
		lead = 1
	}
	nargs := lead
	for _, c := range calls {
		nkeys += len(c.rt.keyArgs)
		nargs += 1 + len(c.reqs)
		nbytes += 8*(9+2*len(c.reqs)) + len(c.reqs)*s.maxMember()
	}
	args := scriptArgs(nkeys, nkeys+nargs)
	// Every block's numbers and its members in one buffer, sized once so
	// that appending never copies it.
	nums := make([]byte, 0, nbytes)
	for _, c := range calls {
		args = append(args, c.rt.keyArgs...)
	}
	if !legacy {
		args = append(args, s.epochFor(calls[0].rt, calls[0].target, global))
	}
	switch lead {
	case 2:
		args = append(args, s.op("reserve"), s.procArg)
	case 1:
		args = append(args, s.op("reserve"))
	}
	want := 1
	for _, c := range calls {
		liveness := livenessFor(s.liveness, c.lim.Window)
		la := c.rt.limitArgs(c.lim, liveness)
		if a := us(c.lim.Ahead); a != 0 && s.ahead.Load() != a {
			s.ahead.Store(a)
		}
		hb := la.quiet
		if c.marking = c.rt.heartbeatDue(liveness, sent.UnixNano()); c.marking != 0 {
			hb = la.heartbeat
		}
		if legacy { // without ahead
			hb = slices.Delete(slices.Clone(hb), 24, 32)
		}
		start := len(nums)
		var full int64
		if c.rt.full.Load() {
			full = 2 // and none waits: the script need not read the log's length
			for _, r := range c.reqs {
				if r.MaxWait != 0 {
					full = 1
					break
				}
			}
		}
		seen := c.rt.seen.Load()
		slot := seen >> 2
		if seen&1 == 1 && !legacy {
			slot = -slot // its own: gone, it was lost, whatever a cancel took
		}
		nums = appendNums(append(nums, hb...), slot, full, int64(len(c.reqs)))
		if !legacy {
			nums = appendNums(nums, s.procNum)
		}
		for _, r := range c.reqs {
			maxWait := int64(-1)
			if r.MaxWait >= 0 {
				maxWait = us(r.MaxWait)
			}
			nums = appendNums(nums, int64(r.N), maxWait)
		}
		args = append(args, nums[start:len(nums):len(nums)])
		for _, r := range c.reqs {
			m := len(nums)
			nums = s.appendMember(nums, r.ID)
			args = append(args, nums[m:len(nums):len(nums)])
		}
		want += 4 + len(c.reqs)
	}
	vals, err := s.eval(ctx, s.theScript(), args, want)
	if err != nil && (global || len(calls) > 1) && redis.HasErrorPrefix(err, "CROSSSLOT") {
		// A plain client on a cluster-mode server: each target alone, with
		// the epoch key of its slot, from now on.
		s.batch.Store(false)
		for _, c := range calls {
			s.reserve([]*reserveCall{c})
		}
		return
	}
	if err != nil {
		if len(calls) == 1 {
			err = fmt.Errorf("redis store: reserve %q: %w", calls[0].target, err)
		} else {
			err = fmt.Errorf("redis store: reserve %d targets: %w", len(calls), err)
		}
		for _, c := range calls {
			c.err = err
		}
		return
	}
	now, vals := vals[0], vals[1:]
	for _, c := range calls {
		s.sawServerTime(c.rt, now, sent)
		c.state = c.rt.decode(now, c.lim, vals[:4+len(c.reqs)], c.grants)
		vals = vals[4+len(c.reqs):]
		if c.marking != 0 { // marked: the next mark is due a while from now
			c.rt.marked.Store(c.marking)
		}
	}
}

// decode reads one target's part of a reserve reply: remaining, reset, live
// (plus, when this call marked the process, its place times 2^24; negative
// when this call added the process to it), pause, then a delay per request
// (-1 - delay when refused) into grants.
func (rt *redisTarget) decode(now int64, lim Limit, vals []int64, grants []Grant) State {
	for i, d := range vals[4:] {
		if d >= 0 {
			grants[i] = Grant{OK: true, Delay: fromUS(d)}
		} else {
			grants[i] = Grant{Delay: fromUS(-1 - d)}
		}
	}
	rt.full.Store(vals[0] == 0 && vals[3] == 0) // nothing remains, and not for a pause
	if vals[2] == 0 {
		rt.marked.Store(0) // the store has no count (lost in a restart): mark on the next call
	}
	reset := vals[1]
	window := us(lim.Window)
	var tail int64
	if reset > 0 { // the log's last entry is now + reset - window
		last := now + reset - window
		own := false // this call booked the last entry
		for _, d := range vals[4:] {
			if d >= 0 && now+d == last {
				own = true
				break
			}
		}
		rt.sawLast(last, own)
		tail = max(reset-window, 0)
	}
	live := max(vals[2], -vals[2])
	return State{
		Remaining:  int(max(vals[0], 0)),
		Young:      vals[0] == -1,
		Lost:       vals[0] == -2,
		ResetAfter: fromUS(reset),
		Live:       int(live % (1 << 24)),
		Place:      int(live >> 24),
		Joined:     vals[2] < 0,
		Tail:       fromUS(tail),
		Paused:     fromUS(vals[3]),
	}
}

// sawLast records last, a slot the log ended with, as the latest seen when
// it is later than that, or whatever it is after this process cancelled
// its own booking at the slot seen; own: this process booked it.
//
// A process's own booking is gone only when Redis lost it or the process
// cancelled it, so the script takes its absence for a loss whatever other
// cancels removed. That matters for a slot booked below one cancelled
// before: seen as any other, it would pass for the cancelled one. And
// after the process cancelled the booking it saw last, the next slot the
// log ends with takes its place, lower or not: the cancelled slot tells
// nothing more.
func (rt *redisTarget) sawLast(last int64, own bool) {
	bit := int64(0)
	if own {
		bit = 1
	}
	for {
		prev := rt.seen.Load()
		var next int64
		switch {
		case prev&2 != 0 || last > prev>>2:
			next = last<<2 | bit
		case last == prev>>2 && own && prev&1 == 0:
			next = prev | 1
		default:
			return
		}
		if rt.seen.CompareAndSwap(prev, next) {
			return
		}
	}
}

// cancelled notes that this process cancels a booking of its own, which
// may be the one at the slot seen last (see sawLast).
func (rt *redisTarget) cancelled() {
	for prev := rt.seen.Load(); prev&1 == 1 && !rt.seen.CompareAndSwap(prev, prev&^1|2); prev = rt.seen.Load() {
	}
}

// target returns target's keys and bookkeeping, made once.
func (s *RedisStore) target(name string) *redisTarget {
	if v, ok := s.targets.Load(name); ok {
		return v.(*redisTarget)
	}
	if n := s.count.Add(1); n > maxRedisTargets && n%maxRedisTargets == 0 {
		s.forget(time.Now())
	}
	keys := s.keys(name)
	v, _ := s.targets.LoadOrStore(name, &redisTarget{keys: keys, keyArgs: []any{keys[0], keys[1], keys[2]}})
	return v.(*redisTarget)
}

// epochFor returns the epoch key a run for rt's target carries: the
// node's, epochArg, when the run may hold targets of many slots (global),
// else the one of the target's slot.
func (s *RedisStore) epochFor(rt *redisTarget, target string, global bool) any {
	if global {
		return s.epochArg
	}
	return rt.epochArg(s, target)
}

// epochArg returns the epoch key of rt's slot, made on the first call
// that needs it: only a store that does not batch (a Cluster) does.
func (rt *redisTarget) epochArg(s *RedisStore, target string) any {
	if k := rt.epoch.Load(); k != nil {
		return *k
	}
	var k any = s.epochKey(target)
	rt.epoch.Store(&k)
	return k
}

// heartbeatDue returns now (unix ns), the time to record as rt's latest mark
// once a run that marks the process live on rt's target succeeds, or 0 when
// no mark is due: the first call marks, then one every quarter of the
// liveness at most (2.5s with the default liveness and windows, margin
// included, up to 2.5s; a window past that).
//
// A mark trims the dead from the target's heartbeat set, renews its TTL
// and stores the count of live processes in the target's pause key, where
// every call reads it; it costs the server a third to a half of a
// decision, so a process spread thin over many targets marks on a fair
// share of its calls. Between marks a process is not marked again even if
// Redis has lost the set, except when Redis has lost the target's log too
// (a restart): then the call marks at once. A run that fails records
// nothing, so the next call marks again.
func (rt *redisTarget) heartbeatDue(liveness time.Duration, now int64) int64 {
	if now-rt.marked.Load() < int64(liveness/4) {
		return 0
	}
	return now
}

// defaultLiveness is a RedisStore's liveness unless WithLiveness sets one.
const defaultLiveness = 10 * time.Second

// livenessFor is how long a process counts as live on a target whose
// window is w, with a store's liveness base: never less than four windows,
// so that half of it, how long a fallback share stays good after the
// store's last answer, spans a waiter's sleep of up to a window and more.
func livenessFor(base, w time.Duration) time.Duration { return max(base, 4*w) }

// livenessBase is the store's liveness before livenessFor; the Throttler
// reckons its fallback shares with it.
func (s *RedisStore) livenessBase() time.Duration { return s.liveness }

// maxRedisTargets bounds the per-target bookkeeping of a crawl over many
// targets: every maxRedisTargets new targets, those idle for a minute are
// forgotten (and made again if they come back), unless the latest slot this
// process saw in the target's log is still within a window (and a minute,
// for clock skew) of now: forgetting it would blind the process to a lost
// log.
const maxRedisTargets = 10_000

func (s *RedisStore) forget(now time.Time) {
	idle := now.Add(-time.Minute).UnixNano()
	s.targets.Range(func(k, v any) bool {
		rt := v.(*redisTarget)
		w := s.liveness // the target's window; before its first Reserve, the liveness
		if a := rt.args.Load(); a != nil {
			w = a.lim.Window
		}
		if rt.used.Load() < idle && rt.seen.Load()>>2 < now.Add(-w-time.Minute).UnixMicro() {
			s.targets.Delete(k)
			s.count.Add(-1)
		}
		return true
	})
}

// Cancel implements Store.
func (s *RedisStore) Cancel(ctx context.Context, target string, id uint64, n int) error {
	rt := s.target(target)
	rt.cancelled()
	// The script keeps the latest cancelled slot in the target's meta for
	// as long as a mark keeps the live count (the liveness, at least four
	// windows), and until a window after the farthest slot a process books
	// (the horizon): by then no slot booked before the cancel is in a
	// window, nor can a process that saw the cancelled slot take its
	// absence for a lost log.
	keep := s.liveness
	if a := rt.args.Load(); a != nil {
		ahead := a.lim.Ahead
		if ahead <= 0 {
			ahead = a.lim.Window // the script's default horizon
		}
		keep = max(livenessFor(s.liveness, a.lim.Window), ahead+2*a.lim.Window)
	}
	args := []any{s.op("cancel"), us(keep)}
	m := s.member(id)
	if n <= 1 {
		args = append(args, m)
	} else {
		for j := 1; j <= n; j++ {
			args = append(args, m+"."+strconv.Itoa(j))
		}
	}
	// The slot this process saw last stays as it was: the script keeps the
	// latest slot a cancel removed in meta, so a log this cancel emptied is
	// not taken for lost; and a log Redis lost the latest entries of must
	// still be noticed as lost after a cancel of an entry it kept.
	_, err := s.run(ctx, target, 3, args)
	return err
}

// Pause implements Store. A read (d 0) of a target this process has
// booked on also reports the hold Reserve would put on it: when the target
// has no log while the store's data is young (Redis lost its data since),
// what is left of the hold, with the window and horizon of this process's
// latest Reserve there. A process that asks before it sends on a slot it
// booked earlier then does not send on a slot Redis forgot, inside a pause
// the fleet heard of and Redis forgot with it.
func (s *RedisStore) Pause(ctx context.Context, target string, d time.Duration) (time.Duration, error) {
	left, _, err := s.pause(ctx, target, d, "")
	return left, err
}

// readPause is Pause(ctx, target, 0) that also reports whether what is
// left is the young store's hold (the Throttler logs it).
func (s *RedisStore) readPause(ctx context.Context, target string) (time.Duration, bool, error) {
	left, held, err := s.pause(ctx, target, 0, "")
	return left, held == heldYoung, err
}

// checkBooking is readPause for a caller about to send on its booking id
// (of n units) of target, in the same call: lost reports that the log no
// longer holds the booking. Redis lost it (a failover to a replica that
// lacked it), and another process may have booked its slot since; the
// store then holds the target as for a lost log, and left is that hold.
//
// The check goes stale twice ctx's time left, and staleSlack, after it
// is sent, on the server's clock as the latest reply for the target told
// it: a check that Redis runs later (it waited behind a stalled server,
// long after its caller gave up on it) does not look for the booking,
// whose entry may since have been cut as dead or cancelled. Without that,
// such a check held the target for a horizon and a window, and every
// process logged a pause that no 429 had asked for.
func (s *RedisStore) checkBooking(ctx context.Context, target string, id uint64, n int) (left time.Duration, young, lost bool, err error) {
	m := s.member(id)
	if n > 1 {
		m += ".1"
	}
	left, held, err := s.pause(ctx, target, 0, m)
	return left, held == heldYoung, held == heldLost, err
}

// staleSlack is what a booking's check allows, past its caller's time,
// for the server's clock to differ from the reading it reckons from: a
// Cluster master's from its replica's, after a failover between the
// reading and the check. A check that comes in time must not go stale.
const staleSlack = 100 * time.Millisecond

// sawServerTime records now, the server's time (µs) in the reply for rt
// to a call sent at sent. The local time is taken at the send, before
// the server's: the server's clock reckoned from it is later than it is,
// and a check's staleness later with it, never earlier.
func (s *RedisStore) sawServerTime(rt *redisTarget, now int64, sent time.Time) {
	rt.clock.Store(now - us(sent.Sub(s.born)))
}

// staleAt returns when, on rt's server's clock (µs), a check sent now
// under ctx goes stale (see checkBooking); 0 when it never does: ctx has
// no deadline, or no reply for rt has told the server's time yet, or the
// time is a test's.
func (s *RedisStore) staleAt(ctx context.Context, rt *redisTarget) int64 {
	d, ok := ctx.Deadline()
	clock := rt.clock.Load()
	if !ok || clock == 0 || s.now != nil {
		return 0
	}
	left := max(time.Until(d), 0)
	return clock + us(time.Since(s.born)+2*left+staleSlack)
}

// What a read of the pause found besides the pause (the script's reply).
const (
	heldNone  = 0
	heldYoung = 1 // the young store's hold
	heldLost  = 2 // the booking checked is gone
)

// pause sets (d > 0) or reads target's pause; a read may check that the
// log still holds member ("" for none), unless Redis runs the check once
// it has gone stale (staleAt).
func (s *RedisStore) pause(ctx context.Context, target string, d time.Duration, member string) (time.Duration, int64, error) {
	sent := time.Now()
	args := []any{s.op("pause"), us(max(d, 0)), us(s.liveness)}
	rt := s.target(target)
	a := rt.args.Load()
	var vals []int64
	var err error
	if d > 0 || a == nil || s.script != nil { // a write, no booking here, or another release's script
		vals, err = s.runKeys(ctx, target, rt.keyArgs, 2, args)
	} else {
		args = append(args, us(a.lim.Window), us(a.lim.Ahead))
		if member != "" {
			args = append(args, member)
			if stale := s.staleAt(ctx, rt); stale > 0 {
				args = append(args, stale)
			}
		}
		vals, err = s.runWithEpoch(ctx, target, rt, args)
	}
	if err != nil {
		return 0, heldNone, err
	}
	s.sawServerTime(rt, vals[0], sent)
	held := int64(heldNone)
	if len(vals) > 2 {
		held = vals[2]
	}
	return fromUS(vals[1]), held, nil
}

// Restore implements Store. A target whose log is empty while the store's
// data is young is held as Reserve holds it, with the horizon of this
// process's latest Reserve on it, or on any target (else a window).
func (s *RedisStore) Restore(ctx context.Context, target string, window time.Duration, entries []Entry) error {
	rt := s.target(target)
	ahead := s.ahead.Load()
	if a := rt.args.Load(); a != nil {
		ahead = us(a.lim.Ahead)
	}
	args := []any{s.op("restore"), us(window), ahead}
	if s.script != nil { // another release's: no horizon
		args = args[:2]
	}
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
	if s.script != nil {
		_, err := s.run(ctx, target, 2, args)
		return err
	}
	_, err := s.runWithEpoch(ctx, target, rt, args)
	return err
}

// runWithEpoch runs a one-target op that reads the store's epoch: the
// target's keys, then the epoch key.
func (s *RedisStore) runWithEpoch(ctx context.Context, target string, rt *redisTarget, args []any) ([]int64, error) {
	global := s.batch.Load()
	keys := append(slices.Clip(rt.keyArgs), s.epochFor(rt, target, global))
	vals, err := s.runKeys(ctx, target, keys, 2, args)
	if err != nil && global && redis.HasErrorPrefix(err, "CROSSSLOT") {
		// A plain client on a cluster-mode server, as in reserve.
		s.batch.Store(false)
		keys[3] = s.epochFor(rt, target, false)
		vals, err = s.runKeys(ctx, target, keys, 2, args)
	}
	return vals, err
}

// run executes a one-target op of the script and checks that the reply is
// an array of at least want integers.
func (s *RedisStore) run(ctx context.Context, target string, want int, args []any) ([]int64, error) {
	return s.runKeys(ctx, target, s.target(target).keyArgs, want, args)
}

// runKeys is run with the keys given.
func (s *RedisStore) runKeys(ctx context.Context, target string, keys []any, want int, args []any) ([]int64, error) {
	vals, err := s.eval(ctx, s.theScript(), slices.Concat(scriptArgs(len(keys), len(keys)+len(args)), keys, args), want)
	if err != nil {
		return nil, fmt.Errorf("redis store: %s %q: %w", args[0], target, err)
	}
	return vals, nil
}

// scriptArgs returns the start of a script command's arguments, room made
// for capacity more: the keys, then the script's ARGV.
func scriptArgs(nkeys, capacity int) []any {
	return append(make([]any, 0, 3+capacity), "evalsha", "", nkeys)
}

// eval runs sc with EVALSHA, and with EVAL when the server does not have it
// (after SCRIPT FLUSH or a restart), and checks that the reply is an array
// of at least want integers: a reply of another shape wraps ErrBadReply.
// args comes from scriptArgs, keys and ARGV appended.
//
// It is what redis.Script.Run does (the same EVALSHA, then EVAL), with the
// arguments built once. The reply is read as values and checked one by one:
// IntSliceCmd would be cheaper but reads a nil element as 0, which in a
// reserve reply means "granted now".
func (s *RedisStore) eval(ctx context.Context, sc script, args []any, want int) ([]int64, error) {
	args[0], args[1] = "evalsha", sc.sha
	cmd := redis.NewCmd(ctx, args...)
	err := s.client.Process(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", sc.src
		cmd = redis.NewCmd(ctx, args...)
		err = s.client.Process(ctx, cmd)
	}
	switch {
	case errors.Is(err, redis.Nil):
		return nil, fmt.Errorf("%w: nil", ErrBadReply)
	case err != nil && isReplyShapeError(err):
		return nil, hidePasswords(fmt.Errorf("%w: %w", ErrBadReply, err), s.passwords)
	case err != nil:
		return nil, hidePasswords(err, s.passwords)
	}
	arr, ok := cmd.Val().([]any)
	if !ok || len(arr) < want {
		return nil, fmt.Errorf("%w: %T of %d values, want %d integers", ErrBadReply, cmd.Val(), len(arr), want)
	}
	vals := make([]int64, len(arr))
	for i, v := range arr {
		n, ok := v.(int64)
		if !ok {
			return nil, fmt.Errorf("%w: value %d is %T, want an integer", ErrBadReply, i, v)
		}
		vals[i] = n
	}
	return vals, nil
}

// isReplyShapeError reports whether err is go-redis failing to read a reply
// as an array of integers (not a Redis error, a timeout or a network error).
func isReplyShapeError(err error) bool {
	var num *strconv.NumError
	if errors.As(err, &num) {
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "redis: can't parse") || strings.HasPrefix(msg, "redis: unexpected")
}

// Probe checks that the store answers, on a connection of its own, as a
// server that takes writes: a replica (a single-node URL left pointing at a
// master that a failover demoted, say) or a Sentinel answers a PING but
// fails every script run, so Probe reports it as down. A pooled client can
// keep failing for a while after Redis is back (dial retries and backoff),
// so a process deciding whether to leave its fallback asks a fresh
// connection instead. The client's passwords never show in its error
// (nor in any other error of the store), even when the server's reply
// quotes them.
//
// A Probe that finds the store up also readies it for the first decisions,
// as far as ctx allows: it loads the script on every master that lacks it
// (the first script run on a server would otherwise send its 48 KB and
// have it compiled), and, the first time, has the client open a pooled
// connection to each master and learn the commands' key positions (a
// Cluster client asks the server the first time). Otherwise the first
// decisions pay for them within the store timeout: three processes
// started together on an idle three-node Cluster took 17 ms for their
// first decision and went past the default 30 ms in two runs of three.
// Call Probe once at start (crawl-demo does); its readying never fails it.
func (s *RedisStore) Probe(ctx context.Context) error {
	return hidePasswords(s.probe(ctx), s.passwords)
}

func (s *RedisStore) probe(ctx context.Context) error {
	sc := s.theScript()
	var err error
	switch c := s.client.(type) {
	case *redis.Client:
		err = probeFresh(ctx, c.Options(), sc)
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return probeFresh(ctx, m.Options(), sc)
		})
	default:
		err = s.client.Ping(ctx).Err()
	}
	if err == nil && !s.warmed.Load() {
		s.warm(ctx)
	}
	return err
}

// warm has the client open a pooled connection to each master and, on a
// Cluster, learn the commands' key positions (one keyed read), once it
// has done so without an error. Errors only leave it to the first
// decisions.
func (s *RedisStore) warm(ctx context.Context) {
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.Ping(ctx).Err()
		})
		if err == nil {
			err = c.Exists(ctx, s.epochKey("warm")).Err()
		}
	default:
		err = s.client.Ping(ctx).Err()
	}
	if err == nil {
		s.warmed.Store(true)
	}
}

// probeFresh asks PING, then ROLE, through a new one-connection client
// with opts, without retries, and closes it. Any failure of PING (no
// answer, a wrong password, a Sentinel that knows no such master) is down;
// a server that does not know ROLE (a compatible server or proxy) counts
// as up; one that says it is a replica or a Sentinel does not. On a server
// that is up it then loads sc if the server lacks it; that failing does
// not make the server down.
func probeFresh(ctx context.Context, opts *redis.Options, sc script) error {
	o := *opts
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxRetries = 1, 0, 0, -1
	o.ContextTimeoutEnabled = true
	// A throwaway client must not register maintenance-notification
	// handlers (go-redis logs a failure each time it cannot).
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	fresh := redis.NewClient(&o)
	defer fresh.Close()
	if err := fresh.Ping(ctx).Err(); err != nil {
		return err
	}
	reply, err := fresh.Do(ctx, "ROLE").Slice()
	switch {
	case err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command"):
		// It answered PING and does not know ROLE: up.
	case err != nil:
		return err
	case len(reply) > 0:
		switch role, _ := reply[0].(string); role {
		case "slave", "replica", "sentinel":
			return fmt.Errorf("redis store: %s is a %s, not a master: it takes no writes", o.Addr, role)
		}
	}
	if have, err := fresh.ScriptExists(ctx, sc.sha).Result(); err == nil && len(have) == 1 && !have[0] {
		_ = fresh.ScriptLoad(ctx, sc.src).Err()
	}
	return nil
}
