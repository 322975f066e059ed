package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBadCommandLines(t *testing.T) {
	srv, hits := countingServer(t)
	urls := writeFile(t, srv.URL+"/a", srv.URL+"/b")
	crawl := func(args ...string) []string {
		return append([]string{"-urls", urls, "-default", "100/1s"}, args...)
	}
	tests := []struct {
		name string
		args []string
		want []string // all in stderr
	}{
		{"zero workers", crawl("-workers", "0"), []string{"-workers 0"}},
		{"negative workers", crawl("-workers", "-3"), []string{"-workers -3"}},
		{"too many workers", crawl("-workers", "50000000"), []string{"-workers 50000000", "at most 10000"}},
		{"rule without pattern", crawl("-rule", "foo"), []string{`"foo"`, "PATTERN=N/DURATION"}},
		{"rule with zero limit", crawl("-rule", "x=0/1s"), []string{`"x"`, `"0/1s"`, "limit must be at least 1"}},
		{"rule with bad pattern", crawl("-rule", "a*b=1/1s"), []string{`"a*b"`}},
		{"default with zero window", crawl("-default", "5/0s"), []string{`"5/0s"`, "window must be positive"}},
		{"bad key mode", crawl("-key", "bogus"), []string{`"bogus"`, "host, domain or ip"}},
		{"host rule by IP", crawl("-key", "ip", "-rule", "api.example.com=10/1s"), []string{`"api.example.com"`, "key mode ip"}},
		{"two rules for one domain", crawl("-key", "domain", "-rule", "api.example.com=10/1s", "-rule", "www.example.com=2/1s"),
			[]string{`"api.example.com"`, `"www.example.com"`, `quota "example.com"`}},
		{"bad store policy", crawl("-on-store-error", "maybe"), []string{`"maybe"`, "local, open or closed"}},
		{"missing URL file", []string{"-urls", "/nonexistent"}, []string{"/nonexistent", "no such file"}},
		{"directory as URL file", []string{"-urls", t.TempDir()}, []string{"is a directory"}},
		{"redis with another scheme", crawl("-redis", "ftp://x"), []string{"ftp://x", `scheme "ftp"`}},
		{"redis without host", crawl("-redis", "redis://"), []string{"redis://", "no host"}},
		{"redis with bad db", crawl("-redis", "redis://localhost/notadb"), []string{"redis://localhost/notadb", "notadb"}},
		{"redis with a negative db", crawl("-redis", "redis://localhost/-1"), []string{"redis://localhost/-1", "database -1: want 0 or more"}},
		{"redis with a negative db parameter", crawl("-redis", "redis://localhost/2?db=-1"), []string{"database -1: want 0 or more"}},
		{"sentinel with a negative db parameter", crawl("-redis", "redis://localhost?master_name=m&db=-1"), []string{"database -1: want 0 or more"}},
		{"redis with a port and no host name", crawl("-redis", "redis://:pw@:6390/0"), []string{"no host"}},
		{"redis with unknown option", crawl("-redis", "redis://localhost?bogus=1"), []string{"bogus"}},
		{"unknown flag", crawl("-frobnicate"), []string{"-frobnicate"}},
		{"negative retries", crawl("-retries", "-1"), []string{"-retries -1"}},
		{"zero timeout", crawl("-timeout", "0s"), []string{"-timeout 0s"}},
		{"negative margin", crawl("-margin", "-1s"), []string{"-margin -1s", "at least 20ms"}},
		{"no margin", crawl("-margin", "0"), []string{"-margin 0s: must be at least 20ms", "more than a rule allows"}},
		{"a margin below lateness and transit", crawl("-margin", "19ms"), []string{"-margin 19ms: must be at least 20ms", "half the margin"}},
		{"zero store timeout", crawl("-store-timeout", "0s"), []string{"-store-timeout 0s", "must be positive"}},
		{"store timeout past a minute", crawl("-store-timeout", "2m"), []string{"-store-timeout 2m0s", "at most 1m0s"}},
		{"margin that overflows a window", crawl("-margin", "2562047h47m16s"), []string{"-margin 2562047h47m16s", "at most 366 days"}},
		{"one pattern twice", crawl("-rule", "example.com=1/1s", "-rule", "Example.COM=2/1s"), []string{`"Example.COM=2/1s"`, `"example.com=1/1s"`, "already has a rule"}},
		{"the default twice", crawl("-rule", " * =5/1s"), []string{"-default 100/1s", `" * =5/1s"`, "keep one"}},
		{"gap over the window", crawl("-rule", "x=1/1s,gap=9000h"), []string{`"x"`, "gap must be at most the window"}},
		{"bad duration", crawl("-timeout", "soon"), []string{`"soon"`}},
		{"stray argument", crawl("http://example.com/"), []string{`"http://example.com/"`}},
		{"demo flag with -urls", crawl("-pages", "5"), []string{"-pages"}},
		{"-out in the demo", []string{"-out", "x.jsonl"}, []string{"-out"}},
		{"list logs without a Redis", crawl("-redis-list-logs"), []string{"-redis-list-logs applies only with -redis"}},
		{"zero pages", []string{"-pages", "0"}, []string{"-pages 0"}},
		{"bad target", []string{"-target", "localhost:8080"}, []string{`"localhost:8080"`}},
		{"serve with target", []string{"-serve", "127.0.0.1:0", "-target", "http://127.0.0.1:1/"}, []string{"-target"}},
		{"output over input", crawl("-out", urls), []string{urls, "overwrite"}},
		{"retries that overflow the attempts", crawl("-retries", "9223372036854775807"), []string{"-retries 9223372036854775807", "at most 100"}},
		{"chart in a missing directory", []string{"-pages", "1", "-chart", "/nonexistent/c.svg"}, []string{"-chart: ", "/nonexistent/c.svg", "no such file"}},
		{"chart that is a directory", []string{"-pages", "1", "-chart", t.TempDir()}, []string{"-chart: ", "is a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runCmd(context.Background(), t, "", tt.args...)
			require.Equal(t, 2, got.code, "stderr: %s", got.stderr)
			for _, w := range tt.want {
				require.Contains(t, got.stderr, w)
			}
			require.Empty(t, got.stdout)
		})
	}
	require.Zero(t, hits.Load(), "nothing may be fetched before the command line is valid")
}

func TestRedisURLNeverShowsThePassword(t *testing.T) {
	tests := []struct {
		name, url string
	}{
		{"bad scheme", "ftp://alice:s3cret@host:6379"},
		{"bad db", "redis://alice:s3cret@host:6379/notadb"},
		{"bad port", "redis://alice:s3cret@host:notaport"},
		{"unknown option", "redis://alice:s3cret@host?frob=1"},
		{"cluster with unknown option", "redis://alice:s3cret@host:7000?addr=host:7001&frob=1"},
		{"sentinel with unknown option", "redis://alice:s3cret@host:26379?master_name=m&password=s3cret&frob=1"},
		{"password in the query of a single node", "redis://alice:s3cret@host:6379?password=s3cret"},
		{"a ';' in the query", "redis://alice:s3cret@host:26379?master_name=fleet;password=s3cret"},
		{"a user and password in addr", "redis://:s3cret@host:7000?addr=alice:s3cret2@host:7001"},
		{"a token in addr", "redis://host:7000?addr=s3cret@host:7001"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runCmd(context.Background(), t, "", "-urls", "-", "-redis", tt.url)
			require.Equal(t, 2, got.code)
			require.NotContains(t, got.stderr, "s3cret")
			require.NotContains(t, got.stderr, "alice")
			require.Contains(t, got.stderr, "***@host")
		})
	}
}

// TestLogsNeverShowTheRedisPasswords: every log line of a run with -redis
// goes through hideInLogs, which takes the URL's passwords out of the
// message and of every attribute, in groups and errors too.
func TestLogsNeverShowTheRedisPasswords(t *testing.T) {
	const pw, sentinelPw = "Sup3rS3cret-cli", "Sup3rS3cret-cli-sentinel"
	rc, err := parseRedisURL("redis://u:" + sentinelPw + "@h:1?master_name=m&password=" + pw)
	require.NoError(t, err)
	var out strings.Builder
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: rc.hideInLogs()}))
	log.Warn("auth failed for "+pw, "error", fmt.Errorf("dial: 'u' '%s' and %s", pw, sentinelPw),
		slog.Group("store", "reply", "ERR unknown command 'auth', with args beginning with: 'u' '"+pw[:5]))
	got := out.String()
	require.NotContains(t, got, pw[:5])
	require.Contains(t, got, `msg="auth failed for ***"`)
	require.Contains(t, got, `error="dial: 'u' '***' and ***"`)
	require.Contains(t, got, `store.reply="ERR unknown command 'auth', with args beginning with: ***"`)

	none, err := parseRedisURL("redis://h:1/0")
	require.NoError(t, err)
	require.Nil(t, none.hideInLogs(), "no password, nothing to hide")
}

func TestParseRedisURL(t *testing.T) {
	tests := []struct {
		name      string
		url       string
		shown     string
		cluster   bool
		master    string // a Sentinel URL's master_name
		addrs     []string
		db        int
		user      string
		pass      string
		tls       bool
		retries   int
		dialRetry int
	}{
		{name: "plain", url: "redis://localhost:6379", shown: "redis://localhost:6379", addrs: []string{"localhost:6379"}, retries: -1, dialRetry: 1},
		{name: "user, password and db", url: "redis://alice:s3cret@db.internal:6380/2", shown: "redis://***@db.internal:6380/2",
			addrs: []string{"db.internal:6380"}, db: 2, user: "alice", pass: "s3cret", retries: -1, dialRetry: 1},
		{name: "tls", url: "rediss://:pw@cache:6379", shown: "rediss://***@cache:6379", addrs: []string{"cache:6379"}, pass: "pw", tls: true, retries: -1, dialRetry: 1},
		{name: "the URL's own retries win", url: "redis://localhost?max_retries=2", shown: "redis://localhost?max_retries=2", addrs: []string{"localhost:6379"}, retries: 2, dialRetry: 1},
		{name: "cluster", url: "redis://u:p@n1:7000?addr=n2:7001&addr=n3:7002", shown: "redis://***@n1:7000?addr=n2:7001&addr=n3:7002",
			cluster: true, addrs: []string{"n1:7000", "n2:7001", "n3:7002"}, user: "u", pass: "p", retries: -1, dialRetry: 1},
		{name: "sentinel", url: "redis://su:sp@s1:26379/3?master_name=fleet&addr=s2:26379&password=mp",
			shown:  "redis://***@s1:26379/3?master_name=fleet&addr=s2:26379&password=***",
			master: "fleet", addrs: []string{"s1:26379", "s2:26379"}, db: 3, user: "su", pass: "sp", retries: -1, dialRetry: 1},
	}
	// What every kind of client is checked for, whichever options hold it.
	type settings struct {
		master      string
		addrs       []string
		db          int
		user, pass  string
		tls         bool
		retries     int
		dialRetry   int
		dialTimeout time.Duration
		ctxTimeouts bool
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, err := parseRedisURL(tt.url)
			require.NoError(t, err)
			require.Equal(t, tt.shown, rc.shown)
			var got settings
			switch {
			case tt.master != "":
				require.True(t, rc.single == nil && rc.cluster == nil)
				o := rc.failover
				require.Equal(t, "mp", o.Password, "the master's password comes from the query")
				got = settings{o.MasterName, o.SentinelAddrs, o.DB, o.SentinelUsername, o.SentinelPassword, o.TLSConfig != nil,
					o.MaxRetries, o.DialerRetries, o.DialTimeout, o.ContextTimeoutEnabled}
			case tt.cluster:
				require.True(t, rc.single == nil && rc.failover == nil)
				o := rc.cluster
				got = settings{"", o.Addrs, 0, o.Username, o.Password, o.TLSConfig != nil,
					o.MaxRetries, o.DialerRetries, o.DialTimeout, o.ContextTimeoutEnabled}
			default:
				require.True(t, rc.cluster == nil && rc.failover == nil)
				o := rc.single
				got = settings{"", []string{o.Addr}, o.DB, o.Username, o.Password, o.TLSConfig != nil,
					o.MaxRetries, o.DialerRetries, o.DialTimeout, o.ContextTimeoutEnabled}
			}
			require.Equal(t, settings{tt.master, tt.addrs, tt.db, tt.user, tt.pass, tt.tls,
				tt.retries, tt.dialRetry, redisDialTimeout, true}, got)
		})
	}
}

func TestRedact(t *testing.T) {
	tests := []struct{ in, want string }{
		{"redis://localhost:6379/0", "redis://localhost:6379/0"},
		{"redis://alice:pw@localhost:6379/0", "redis://***@localhost:6379/0"},
		{"redis://:p@ss@host", "redis://***@host"},
		{"alice:pw@host:6379", "***@host:6379"},
		{"redis://s:1?master_name=m&password=pw&Sentinel_Password=x&db=1", "redis://s:1?master_name=m&password=***&Sentinel_Password=***&db=1"},
		{"redis://:a?b@s:1?password=pw", "redis://***@s:1?password=***"},
		{"redis://s:1?master_name=m;password=pw", "redis://s:1?master_name=m;password=***"}, // a ';' parses as no separator
		{"redis://s:1?addr=t:2&addr=u:Sec@v:3", "redis://***@v:3"},                          // hides more than the password
		{"redis://s:1/?x=1&addr=u:Sec@v:3;y", "redis://***@v:3;y"},
		{"redis://s:1/?addr=v:3&Q=u:Sec@v:3", "redis://***@v:3"},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			require.Equal(t, tt.want, redact(tt.in))
		})
	}
}

func TestRulesFromFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-urls", "-", "-default", "7/1m", "-rule", "a.example=4/1s", "-rule", "*.example=3/1s,gap=200ms"}, nil)
	require.NoError(t, err)
	rs, err := cfg.throttleRules()
	require.NoError(t, err)
	for host, want := range map[string]string{"a.example": "4/1s", "b.example": "3/1s,gap=200ms", "other.org": "7/1m"} {
		r, _, ok := rs.Lookup(host)
		require.True(t, ok, host)
		require.Equal(t, want, r.String(), host)
	}
}

func TestHelp(t *testing.T) {
	got := runCmd(context.Background(), t, "", "-h")
	require.Equal(t, 0, got.code)
	for _, flag := range []string{"-urls", "-out", "-redis", "-redis-list-logs", "-rule", "-default", "-workers", "-retries", "-margin", "-key", "-on-store-error", "-timeout", "-store-timeout", "-v", "-chart", "-pages", "-target", "-serve"} {
		require.Regexp(t, "\n  "+flag+"[ \t\n]", got.stderr, "help for %s", flag)
	}
	require.True(t, strings.HasPrefix(got.stderr, "Usage:"))
}

// TestChartIsCheckedAtStart: a -chart that cannot be written stops the
// demo and -serve before they start; checking one that can changes
// nothing on disk.
func TestChartIsCheckedAtStart(t *testing.T) {
	_, err := parseFlags([]string{"-serve", "127.0.0.1:0", "-chart", t.TempDir()}, io.Discard)
	var ue *usageError
	require.ErrorAs(t, err, &ue)
	require.ErrorContains(t, err, "-chart: ")

	dir := t.TempDir()
	fresh := filepath.Join(dir, "new.svg")
	_, err = parseFlags([]string{"-chart", fresh}, io.Discard)
	require.NoError(t, err)
	require.NoFileExists(t, fresh, "the check leaves no file behind")

	old := filepath.Join(dir, "old.svg")
	require.NoError(t, os.WriteFile(old, []byte("<svg/>"), 0o644))
	_, err = parseFlags([]string{"-chart", old}, io.Discard)
	require.NoError(t, err)
	kept, err := os.ReadFile(old)
	require.NoError(t, err)
	require.Equal(t, "<svg/>", string(kept), "the check does not truncate")
}
