package main

import (
	"strconv"
	"strings"

	"github.com/idemkey/idemkey/internal/redistest"
)

// redisStats is the part of INFO the table uses.
type redisStats struct {
	calls map[string]int64 // per command, from INFO commandstats
	usec  map[string]int64
	cpu   float64 // used_cpu_user plus used_cpu_sys, seconds
}

// notCounted lists commands that are the driver's or a client's
// housekeeping, not a request's work.
var notCounted = map[string]bool{"info": true, "ping": true, "hello": true, "client": true, "client|setinfo": true, "config": true, "command": true}

func readRedisStats(addr string) (redisStats, error) {
	st := redisStats{calls: map[string]int64{}, usec: map[string]int64{}}
	reply, err := redistest.Do(addr, "INFO", "commandstats")
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(reply, "\n") {
		// cmdstat_evalsha:calls=12,usec=34,usec_per_call=2.83,...
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls[name] = n
			case "usec":
				st.usec[name] = n
			}
		}
	}
	cpu, err := redistest.Info(addr, "cpu")
	if err != nil {
		return st, err
	}
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		f, _ := strconv.ParseFloat(cpu[k], 64)
		st.cpu += f
	}
	return st, nil
}

// redisDelta is what a cell cost Redis: commands run (those a client sent
// and those scripts ran inside Redis alike), their time, and the server's
// CPU time.
type redisDelta struct {
	calls map[string]int64
	usec  map[string]int64
	cpu   float64 // seconds
}

func (a redisStats) delta(b redisStats) redisDelta {
	d := redisDelta{cpu: b.cpu - a.cpu, calls: map[string]int64{}, usec: map[string]int64{}}
	for name, n := range b.calls {
		if notCounted[name] || strings.HasPrefix(name, "client") {
			continue
		}
		if c := n - a.calls[name]; c > 0 {
			d.calls[name] = c
			d.usec[name] = b.usec[name] - a.usec[name]
		}
	}
	return d
}

func (d *redisDelta) add(o redisDelta) {
	if d.calls == nil {
		d.calls, d.usec = map[string]int64{}, map[string]int64{}
	}
	d.cpu += o.cpu
	for k, v := range o.calls {
		d.calls[k] += v
	}
	for k, v := range o.usec {
		d.usec[k] += v
	}
}

// sentUsec returns the time Redis spent on the commands clients sent: a
// script's time includes the commands it ran, so the commands scripts ran
// count only in the share of their calls that clients sent themselves.
func (d redisDelta) sentUsec(sent map[string]int64) float64 {
	var t float64
	for name, calls := range d.calls {
		if calls == 0 {
			continue
		}
		share := min(1, float64(sent[name])/float64(calls))
		t += share * float64(d.usec[name])
	}
	return t
}
