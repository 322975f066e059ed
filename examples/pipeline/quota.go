package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/internal/secret"
	"github.com/fleetgate/fleetgate/throttle"
)

// pingTimeout bounds the check, at start, that REDIS_URL reaches a server.
const pingTimeout = 2 * time.Second

// quota is the fleet quota every API call waits on: in this process only,
// or shared through Redis by every copy of the job that uses the same
// server.
type quota struct {
	*throttle.Throttler
	where  string // "embedded store" or "redis ADDR db N", never a password
	store  *throttle.RedisStore
	client *redis.Client
}

// redisLogger passes go-redis's log lines to a slog.Logger at Debug: it
// logs every failed dial on its own, and the throttle already reports an
// outage once.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}

// openQuota returns a quota applying rule to every host: the API is the
// job's only target. With an empty redisURL the quota lives in this
// process; otherwise in the single Redis server the URL names (not a node
// of a Cluster), which must answer as a master. An outage after that
// start is left to the throttle's failure policy (FailLocal: each copy
// falls back to its share of the rule).
func openQuota(ctx context.Context, redisURL string, rule throttle.Rule, margin time.Duration, log *slog.Logger) (*quota, error) {
	rules := &throttle.Rules{}
	if err := rules.Set(throttle.DefaultPattern, rule); err != nil {
		return nil, err
	}
	if redisURL == "" {
		t, err := throttle.New(rules, throttle.WithMargin(margin), throttle.WithLogger(log))
		if err != nil {
			return nil, err
		}
		return &quota{Throttler: t, where: "embedded store"}, nil
	}
	if err := checkRedisURL(redisURL); err != nil {
		return nil, err
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) { // it quotes the URL, or a part of it that may be the password
			err = errors.New("not a URL: " + secret.URLError(ue, "redis://, rediss:// or unix://"))
		}
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	if opts.DB < 0 {
		return nil, fmt.Errorf("REDIS_URL: database %d: want 0 or more", opts.DB)
	}
	opts.ContextTimeoutEnabled = true // so the throttle's store timeout bounds every call
	if u, err := url.Parse(redisURL); err == nil && !u.Query().Has("max_retries") {
		// A store call that fails is the failure policy's to decide, at
		// once: go-redis's own retries would only delay it.
		opts.MaxRetries = -1
	}
	q := &quota{where: fmt.Sprintf("redis %s db %d", opts.Addr, opts.DB), client: redis.NewClient(opts)}
	if q.store, err = throttle.NewRedisStore(q.client); err != nil {
		q.client.Close()
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := q.store.Probe(pctx); err != nil { // it answers, as a master
		q.client.Close()
		return nil, fmt.Errorf("REDIS_URL: %s: %w", q.where, err)
	}
	if info, err := q.client.Info(pctx, "cluster").Result(); err == nil && strings.Contains(info, "cluster_enabled:1") {
		// A plain client reaches only the keys of this node's slots: every
		// other target's calls would fail, and the job run in fallback.
		// (A server that refuses INFO is taken for a single one: the
		// probe found it answering as a master.)
		q.client.Close()
		return nil, fmt.Errorf("REDIS_URL: %s is a node of a Redis Cluster: want a single server", q.where)
	}
	if q.Throttler, err = throttle.New(rules, throttle.WithStore(q.store), throttle.WithMargin(margin), throttle.WithLogger(log)); err != nil {
		q.client.Close()
		return nil, err
	}
	return q, nil
}

// checkRedisURL returns an error for what redis.ParseURL takes without a
// word but would not reach the server the URL means: a redis:// or
// rediss:// URL without "//" ("redis:PASSWORD@HOST:PORT/0" has no host to
// go-redis) or without a host name (go-redis dials localhost instead).
// Its errors quote nothing of the URL, which holds the password. (A
// database below 0, in the path or a db parameter, is refused once
// parsed: go-redis would select none, database 0.)
func checkRedisURL(raw string) error {
	const want = "want redis://[:PASSWORD@]HOST:PORT[/DB]"
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil // redis.ParseURL says why, in words that hide the password
	case u.Scheme != "redis" && u.Scheme != "rediss":
		return nil // unix://, or a scheme redis.ParseURL refuses
	case u.Opaque != "":
		return fmt.Errorf("REDIS_URL: no \"//\" after %q: %s", u.Scheme+":", want)
	case u.Hostname() == "": // ":6379" too: go-redis dials localhost
		return fmt.Errorf("REDIS_URL: no host: %s", want)
	}
	return nil
}

// Close releases the throttler, then the Redis store and client if any.
func (q *quota) Close() error {
	err := q.Throttler.Close()
	if q.client != nil {
		err = errors.Join(err, q.store.Close(), q.client.Close())
	}
	return err
}
