// Command crawl-demo shows fleetgate keeping a fleet of crawlers under a
// site's rate limit, and is a small fleet crawler itself.
//
// With no arguments it runs the demo: a strict site on loopback that bans
// any client sending more than 20 requests in any second, a fleet of
// workers crawling it through the fleet-wide throttle, a table of what the
// site saw and an SVG chart of it. With -urls FILE it fetches every URL of
// FILE and writes one JSON line per URL. Copies sharing -redis share every
// target's limit. Run crawl-demo -h for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/redis/go-redis/v9"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one ends the process at once.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command: it parses args, runs the demo or the crawler
// until done or until ctx ends, and returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	stderr = &lockedWriter{w: stderr}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "crawl-demo: %v\nRun crawl-demo -h for the flags.\n", err)
		return 2
	}
	level := slog.LevelInfo
	if cfg.verbose {
		level = slog.LevelDebug
	}
	// A server's error may quote the -redis URL's password: no log line
	// shows it.
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level, ReplaceAttr: cfg.redis.hideInLogs()}))
	if cfg.redis != nil {
		redis.SetLogger(redisLogger{log: log}) // go-redis has one logger per process
	}
	if cfg.urls != "" {
		return runCrawl(ctx, cfg, stdin, stdout, stderr, log)
	}
	return runDemo(ctx, cfg, stdout, stderr, log)
}

// lockedWriter serializes writes to w: the progress reports and the log
// (stale slots, a store's outage) reach stderr from several goroutines, and
// each line must go out whole whatever w is.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
