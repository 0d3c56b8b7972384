package e2b

import (
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// E2B's sandbox metrics (Sandbox.getMetrics: GET /sandboxes/{id}/metrics, start and end in
// Unix seconds): a running sandbox's usage is sampled every metricEvery, as E2B's buckets
// are, and the last metricsKept samples are kept with it. A sample sums its contexts'
// Namespace.Usage: CPU time (cpuUsedPct is the share of cpuCount CPUs it used since the
// sample before), memory, and the working directories' bytes; memTotal and diskTotal are
// what its info reports (memoryMB, diskSizeMB), else the sum of its contexts' limits.

const (
	metricEvery = 5 * time.Second
	metricsKept = 720 // an hour's
)

// metricSample is one of a sandbox's samples.
type metricSample struct {
	at                             time.Time
	cpu                            time.Duration
	cpuPct                         float64
	mem, memTotal, disk, diskTotal int64
}

// sandboxMetric is a sample as the API gives it (E2B's SandboxMetric).
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// sampleMetrics samples every running sandbox's usage each metricEvery, until stop.
func (s *Server) sampleMetrics(stop <-chan struct{}) {
	tick := time.NewTicker(metricEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		s.mu.Lock()
		all := slices.Collect(maps.Values(s.sandboxes))
		s.mu.Unlock()
		for _, sb := range all {
			s.sample(sb)
		}
	}
}

// sample adds a sample of sb's usage to its metrics, if it runs.
func (s *Server) sample(sb *sandbox) {
	sb.mu.Lock()
	contexts := slices.Clone(sb.contexts)
	sb.mu.Unlock()
	if len(contexts) == 0 {
		return
	}
	m := metricSample{at: time.Now()}
	for _, cc := range contexts {
		ns := cc.ns.Load()
		if ns == nil {
			continue // (a bash context: its shell is the default context's, and counts there)
		}
		u, err := ns.Usage()
		if err != nil {
			continue // (closed meanwhile)
		}
		m.cpu += u.CPU
		m.mem += u.Memory
		m.memTotal += u.MemoryLimit
		m.disk += u.Disk
		m.diskTotal += u.DiskLimit
	}
	if s.cfg.MemoryMB > 0 {
		m.memTotal = int64(s.cfg.MemoryMB) << 20
	}
	if s.cfg.DiskMB > 0 {
		m.diskTotal = int64(s.cfg.DiskMB) << 20
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if n := len(sb.metrics); n > 0 {
		last := sb.metrics[n-1]
		if wall := m.at.Sub(last.at); wall > 0 && m.cpu >= last.cpu && s.cfg.CPUCount > 0 {
			m.cpuPct = 100 * float64(m.cpu-last.cpu) / float64(wall) / float64(s.cfg.CPUCount)
		}
	}
	if len(sb.metrics) == metricsKept {
		sb.metrics = append(sb.metrics[:0], sb.metrics[1:]...)
	}
	sb.metrics = append(sb.metrics, m)
}

// metricsRequest is GET /sandboxes/{id}/metrics: sb's samples from start to end (Unix
// seconds, each optional), oldest first; a running sandbox with none yet is sampled now.
func (s *Server) metricsRequest(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var from, to time.Time
	for name, t := range map[string]*time.Time{"start": &from, "end": &to} {
		if v := r.URL.Query().Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				writeError(w, http.StatusBadRequest, name+": Unix seconds, not "+echo(v))
				return
			}
			*t = time.Unix(n, 0)
		}
	}
	sb.mu.Lock()
	none := len(sb.metrics) == 0
	sb.mu.Unlock()
	if none {
		s.sample(sb)
	}
	sb.mu.Lock()
	kept := slices.Clone(sb.metrics)
	sb.mu.Unlock()
	out := []sandboxMetric{}
	for _, m := range kept {
		at := m.at.Truncate(time.Second)
		if !from.IsZero() && at.Before(from) || !to.IsZero() && at.After(to) {
			continue
		}
		out = append(out, sandboxMetric{Timestamp: m.at.UTC(), TimestampUnix: m.at.Unix(), CPUCount: s.cfg.CPUCount,
			CPUUsedPct: m.cpuPct, MemUsed: m.mem, MemTotal: m.memTotal, DiskUsed: m.disk, DiskTotal: m.diskTotal})
	}
	writeJSON(w, http.StatusOK, out)
}
