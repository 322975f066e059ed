package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Progress refresh intervals: a terminal's bar is redrawn often, a log file
// gets one line per second.
const (
	barInterval  = 100 * time.Millisecond
	lineInterval = time.Second
	barWidth     = 30
)

// status is what a progress report shows: done of total (total 0: no bar)
// and a short text.
type status struct {
	done, total int
	text        string
}

// progress reports a run's status on w until Stop: a bar redrawn in place
// when w is a terminal, otherwise a plain line per second.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time
	get   func() status
	stop  chan struct{}
	done  chan struct{}
}

// startProgress starts reporting get's status on w.
func startProgress(w io.Writer, get func() status) *progress {
	p := &progress{w: w, tty: isTerminal(w), start: time.Now(), get: get, stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *progress) run() {
	defer close(p.done)
	every := lineInterval
	if p.tty {
		every = barInterval
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			if p.tty { // leave the final bar on its own line
				fmt.Fprintf(p.w, "\r%s\x1b[K\n", p.render(p.get()))
			}
			return
		case <-tick.C:
			if p.tty {
				fmt.Fprintf(p.w, "\r%s\x1b[K", p.render(p.get()))
			} else {
				fmt.Fprintf(p.w, "progress: %s\n", p.render(p.get()))
			}
		}
	}
}

// Stop ends the reports and waits until the last one is written.
func (p *progress) Stop() {
	close(p.stop)
	<-p.done
}

// render formats s, with a bar on a terminal.
func (p *progress) render(s status) string {
	elapsed := time.Since(p.start).Truncate(100 * time.Millisecond)
	if s.total <= 0 {
		return fmt.Sprintf("%v  %s", elapsed, s.text)
	}
	count := fmt.Sprintf("%d/%d", s.done, s.total)
	if !p.tty {
		return fmt.Sprintf("%s  %v  %s", count, elapsed, s.text)
	}
	filled := min(barWidth, barWidth*s.done/s.total)
	bar := strings.Repeat("█", filled) + strings.Repeat("░", barWidth-filled)
	return fmt.Sprintf("%s %s  %v  %s", bar, count, elapsed, s.text)
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	if l, ok := w.(*lockedWriter); ok {
		w = l.w
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
