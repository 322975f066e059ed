package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetgate/fleetgate/internal/secret"
	"github.com/fleetgate/fleetgate/throttle"
)

// Client settings for a fleet's store, applied unless the URL sets them.
// Every store call has its own short timeout (throttle.DefaultStoreTimeout),
// after which the failure policy decides; go-redis must honour it rather
// than retry behind it.
const (
	redisDialTimeout = time.Second
	redisMaxRetries  = -1 // go-redis: -1 turns retries off; 0 would mean 3
	redisDialRetries = 1
)

// redisConfig is a parsed -redis URL: a single node, a Cluster, or a master
// found through Sentinel.
type redisConfig struct {
	shown    string   // the URL without its user and password, for messages
	secrets  []string // its passwords: see hide
	single   *redis.Options
	cluster  *redis.ClusterOptions
	failover *redis.FailoverOptions
}

// parseRedisURL reads a redis:// or rediss:// URL: with
// redis.ParseFailoverURL when it has a master_name query parameter (the
// URL's hosts are then Sentinels), else with redis.ParseClusterURL when it
// has addr query parameters, else with redis.ParseURL. Its errors never
// contain the user or the password.
func parseRedisURL(raw string) (*redisConfig, error) {
	shown := redact(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("-redis %s: not a URL", shown)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("-redis %s: scheme %q: want redis:// or rediss://", shown, u.Scheme)
	}
	if u.Hostname() == "" { // ":6379" too: go-redis would dial localhost
		return nil, fmt.Errorf("-redis %s: no host", shown)
	}
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		// Go's parser leaves out what it cannot read (a parameter after
		// a ';'), which would drop master_name or a password unseen.
		return nil, fmt.Errorf("-redis %s: its query does not parse: separate parameters with '&' and escape '%%', ';' and '&' in values", shown)
	}
	q := u.Query()
	for _, a := range q["addr"] {
		if strings.Contains(a, "@") {
			// go-redis takes none there: it fails quoting the value, or
			// dials "user@host" as a host name.
			return nil, fmt.Errorf("-redis %s: an addr parameter holds a user or password: give them once, before the first host", shown)
		}
	}
	rc := &redisConfig{shown: shown, secrets: passwordsOf(u)}
	switch {
	case q.Has("master_name"):
		if rc.failover, err = redis.ParseFailoverURL(raw); err == nil {
			o := rc.failover
			settle(q, &o.ContextTimeoutEnabled, &o.DialTimeout, &o.MaxRetries, &o.DialerRetries)
		}
	case q.Has("addr"):
		if rc.cluster, err = redis.ParseClusterURL(raw); err == nil {
			o := rc.cluster
			o.MaintNotificationsConfig = noMaintNotifications()
			settle(q, &o.ContextTimeoutEnabled, &o.DialTimeout, &o.MaxRetries, &o.DialerRetries)
		}
	default:
		if rc.single, err = redis.ParseURL(raw); err == nil {
			o := rc.single
			o.MaintNotificationsConfig = noMaintNotifications()
			settle(q, &o.ContextTimeoutEnabled, &o.DialTimeout, &o.MaxRetries, &o.DialerRetries)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("-redis %s: %s", shown, scrub(err.Error(), raw, u))
	}
	// go-redis takes a database below 0, in the path or a db parameter,
	// and selects none: database 0.
	db := 0
	switch {
	case rc.single != nil:
		db = rc.single.DB
	case rc.failover != nil:
		db = rc.failover.DB
	}
	if db < 0 {
		return nil, fmt.Errorf("-redis %s: database %d: want 0 or more", shown, db)
	}
	return rc, nil
}

// noMaintNotifications turns off go-redis's maintenance notifications
// (a Redis Enterprise feature): each throttler's health probe builds a
// fresh client from these options, which would try to register their push
// handlers again and log a failure every time.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// settle applies the client settings a fleet's store needs: context
// timeouts on, and this package's dial timeout and retries unless the URL's
// query sets them.
func settle(q url.Values, ctxTimeouts *bool, dialTimeout *time.Duration, retries, dialRetries *int) {
	*ctxTimeouts = true
	*dialTimeout = orDefault(q, "dial_timeout", *dialTimeout, redisDialTimeout)
	*retries = orDefault(q, "max_retries", *retries, redisMaxRetries)
	*dialRetries = orDefault(q, "dialer_retries", *dialRetries, redisDialRetries)
}

// orDefault returns v when the URL's query sets key, def otherwise.
func orDefault[T any](q url.Values, key string, v, def T) T {
	if q.Has(key) {
		return v
	}
	return def
}

// client returns a new client: each call is a separate connection pool, as
// in a separate process.
func (rc *redisConfig) client() redis.UniversalClient {
	switch {
	case rc.cluster != nil:
		return redis.NewClusterClient(rc.cluster)
	case rc.failover != nil:
		return redis.NewFailoverClient(rc.failover)
	}
	return redis.NewClient(rc.single)
}

// redact returns raw with everything between "://" and the last '@' (the
// user and password) replaced by "***", and so the value of every query
// parameter whose name holds "password" (a Sentinel URL's master
// password); a user and password in another value (addr=user:pw@host) are
// before the last '@', and hidden so. It works on strings that do not
// parse as URLs too, and may hide more than the user and password, never
// less.
func redact(raw string) string {
	return redactQuery(redactUser(raw))
}

func redactUser(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		scheme, rest = "", raw
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return raw
	}
	if ok {
		return scheme + "://***" + rest[at:]
	}
	return "***" + rest[at:]
}

// redactQuery redacts the query of raw, after its first '?': parameters
// are taken apart at '&' and at ';' (which Go's parser does not take).
func redactQuery(raw string) string {
	base, query, ok := strings.Cut(raw, "?")
	if !ok {
		return raw
	}
	var b strings.Builder
	b.WriteString(base + "?")
	for query != "" {
		p, rest := query, ""
		if i := strings.IndexAny(query, "&;"); i >= 0 {
			p, rest = query[:i], query[i:]
		}
		if k, _, ok := strings.Cut(p, "="); ok && secretParam(k) {
			p = k + "=***"
		}
		b.WriteString(p)
		if rest != "" {
			b.WriteByte(rest[0])
			rest = rest[1:]
		}
		query = rest
	}
	return b.String()
}

// secretParam reports whether a URL query parameter named k holds a secret.
func secretParam(k string) bool {
	return strings.Contains(strings.ToLower(k), "password")
}

// scrub removes raw, its user and its passwords from a message about the
// URL (a parse error, which may quote any part of it): the passwords
// wherever they appear, however short, the user where it stands quoted
// (secret.Hide).
func scrub(msg, raw string, u *url.URL) string {
	ps := passwordsOf(u)
	secrets := ps
	if u.User != nil {
		secrets = append(slices.Clip(ps), u.User.Username())
	}
	msg = secret.Hide(strings.ReplaceAll(msg, raw, redact(raw)), secrets)
	slices.SortFunc(ps, func(a, b string) int { return len(b) - len(a) }) // one may begin with another
	for _, p := range ps {
		msg = strings.ReplaceAll(msg, p, "***")
	}
	return msg
}

// passwordsOf returns u's password and the values of its query parameters
// that hold passwords, the empty ones left out. (An addr parameter with a
// user or password stops parseRedisURL before go-redis can quote it.)
func passwordsOf(u *url.URL) []string {
	var ps []string
	if u.User != nil {
		p, _ := u.User.Password()
		ps = append(ps, p)
	}
	for k, vs := range u.Query() {
		if secretParam(k) {
			ps = append(ps, vs...)
		}
	}
	return slices.DeleteFunc(ps, func(s string) bool { return s == "" })
}

// hide returns msg with the URL's passwords taken out (secret.Hide): a
// server's error may quote them (one that does not know AUTH answers
// "unknown command 'auth', with args beginning with: 'user' 'password'").
// Every log line and every message about the store goes through it. The
// user is left: hiding a name such as "default" everywhere would garble
// the logs.
func (rc *redisConfig) hide(msg string) string { return secret.Hide(msg, rc.secrets) }

// hideInLogs is a slog ReplaceAttr function that shows the URL's
// passwords as "***" in every attribute and message; nil when the URL has
// none.
func (rc *redisConfig) hideInLogs() func([]string, slog.Attr) slog.Attr {
	if rc == nil || len(rc.secrets) == 0 {
		return nil
	}
	return func(_ []string, a slog.Attr) slog.Attr {
		switch a.Value.Kind() {
		case slog.KindString, slog.KindAny:
			v := a.Value.String()
			if h := rc.hide(v); h != v {
				return slog.String(a.Key, h)
			}
		}
		return a
	}
}

// newThrottler returns a Throttler for rules with the command line's
// options, on rdb when it is not nil (a RedisStore) or on its own
// MemoryStore, and what closes both.
func newThrottler(cfg *config, rules *throttle.Rules, rdb redis.UniversalClient, log *slog.Logger) (*throttle.Throttler, func(), error) {
	opts := []throttle.Option{
		throttle.WithMargin(cfg.margin),
		throttle.WithStoreTimeout(cfg.storeTO),
		throttle.WithKeyMode(throttle.KeyMode(cfg.keyMode)),
		throttle.WithFailurePolicy(throttle.FailurePolicy(cfg.policy)),
		throttle.WithLogger(log),
	}
	if rdb != nil {
		var ropts []throttle.RedisOption
		if cfg.listLogs {
			ropts = append(ropts, throttle.WithListLogs())
		}
		store, err := throttle.NewRedisStore(rdb, ropts...)
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, throttle.WithStore(store))
		thr, err := throttle.New(rules, opts...)
		if err != nil {
			return nil, nil, err
		}
		return thr, func() { _ = thr.Close(); _ = store.Close() }, nil
	}
	thr, err := throttle.New(rules, opts...)
	if err != nil {
		return nil, nil, err
	}
	return thr, func() { _ = thr.Close() }, nil
}

// checkRedis probes the store once (throttle.RedisStore.Probe: it must
// answer, as a master, not a replica or a Sentinel), so that a wrong
// address shows up at the start rather than as a crawl that never moves.
// Under -on-store-error open a failure is only logged and the crawl goes on
// without the store; under local or closed it is an error: a process that
// has never reached the store does not know how many share each target, so
// it could only wait.
func checkRedis(ctx context.Context, rc *redisConfig, rdb redis.UniversalClient, policy throttle.FailurePolicy, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*redisDialTimeout)
	defer cancel()
	store, err := throttle.NewRedisStore(rdb)
	if err == nil {
		err = store.Probe(ctx)
	}
	if err != nil {
		if policy != throttle.FailOpen {
			return fmt.Errorf("-redis %s does not answer as a master: %s (with -on-store-error %s the crawl needs the store at the start; -on-store-error open crawls without it)", rc.shown, rc.hide(err.Error()), policy)
		}
		log.Warn("redis does not answer; the store failure policy applies",
			"redis", rc.shown, "on-store-error", policy.String(), "error", rc.hide(err.Error()))
		return nil
	}
	log.Debug("redis answers", "redis", rc.shown)
	return nil
}

// redisLogger passes go-redis's own log lines (failed dials, mostly, which
// the throttle's fallback already reports) to log at Debug, so they show
// with -v and do not flood stderr otherwise.
type redisLogger struct{ log *slog.Logger }

// Printf implements go-redis's internal logging interface.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}
