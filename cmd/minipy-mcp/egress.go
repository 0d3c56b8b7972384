package main

// -egress-allow and -egress-allow-file: the isolated engine's egress policy
// (minipy.Egress), re-read on SIGHUP.

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/minipy-go/minipy"
)

// egressPresets are the names -egress-allow and -egress-allow-file take for a service's
// hosts.
var egressPresets = map[string][]string{
	// pip install from PyPI: the index and the files.
	"pypi": {"pypi.org", "files.pythonhosted.org"},
	// git clone and raw files from GitHub.
	"github": {"github.com", "codeload.github.com", "objects.githubusercontent.com", "raw.githubusercontent.com"},
	// models and datasets from the Hugging Face Hub.
	"huggingface": {"huggingface.co", "*.huggingface.co", "*.hf.co"},
}

// egressFlags are the flags of the egress policy.
type egressFlags struct {
	allow string // -egress-allow
	file  string // -egress-allow-file
	nets  string // -egress-allow-nets
}

func (f *egressFlags) register() {
	flag.StringVar(&f.allow, "egress-allow", "", "with -backend isolated: let the code reach these hosts through the "+
		"sandbox's egress proxy: a comma-separated `list` of names (pypi.org), *.domain, name:port, and presets ("+
		presetNames()+"); the code reaches nothing else, and never this machine's or private addresses")
	flag.StringVar(&f.file, "egress-allow-file", "", "with -backend isolated: more of -egress-allow, one per line "+
		"(# comments), in this `file`, read again on SIGHUP")
	flag.StringVar(&f.nets, "egress-allow-nets", "", "with -egress-allow: private or local addresses the allowed "+
		"hosts may have all the same, a comma-separated `list` of CIDR prefixes (an internal package mirror: 10.1.2.3/32)")
}

func presetNames() string {
	var names []string
	for n := range egressPresets {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// set reports whether any egress flag was given.
func (f *egressFlags) set() bool { return f.allow != "" || f.file != "" }

// policy reads the flags (and the file) into an Egress.
func (f *egressFlags) policy() (*minipy.Egress, error) {
	entries := splitList(f.allow)
	if f.file != "" {
		more, err := readAllowFile(f.file)
		if err != nil {
			return nil, err
		}
		entries = append(entries, more...)
	}
	var nets []netip.Prefix
	for _, n := range splitList(f.nets) {
		p, err := netip.ParsePrefix(n)
		if err != nil {
			return nil, fmt.Errorf("-egress-allow-nets: %w", err)
		}
		nets = append(nets, p)
	}
	var allow []string
	for _, e := range entries {
		if hosts, ok := egressPresets[strings.ToLower(e)]; ok {
			allow = append(allow, hosts...)
		} else {
			allow = append(allow, e)
		}
	}
	return &minipy.Egress{Allow: allow, AllowNets: nets}, nil
}

func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// readAllowFile reads -egress-allow-file: entries one per line (or comma-separated), #
// starting a comment.
func readAllowFile(path string) ([]string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("-egress-allow-file: %w", err)
	}
	defer fh.Close()
	var out []string
	lines := bufio.NewScanner(fh)
	for lines.Scan() {
		line, _, _ := strings.Cut(lines.Text(), "#")
		out = append(out, splitList(line)...)
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("-egress-allow-file: %w", err)
	}
	return out, nil
}

// logEgress logs what the egress proxy refused (the allowed are counted in /metrics).
func logEgress(ev minipy.EgressEvent) {
	if !ev.Allowed || ev.Refusal != "" {
		log.Printf("minipy-mcp: egress refused: %s", ev.Refusal)
	}
}

// reloadEgressOnHUP reads the policy again at each SIGHUP until ctx ends, and gives it to
// iso; a policy that does not read leaves the one in force.
func reloadEgressOnHUP(ctx context.Context, f *egressFlags, iso *minipy.Isolated) {
	onHUP(ctx, func() {
		p, err := f.policy()
		if err == nil {
			err = iso.SetEgress(*p)
		}
		if err != nil {
			log.Printf("minipy-mcp: the egress policy did not read again, the one in force stays: %v", err)
			return
		}
		log.Printf("minipy-mcp: egress read again: %s", describeEgress(p))
	})
}

// onHUP calls reload at each SIGHUP until ctx ends.
func onHUP(ctx context.Context, reload func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				reload()
			}
		}
	}()
}

func describeEgress(p *minipy.Egress) string {
	if len(p.Allow) == 0 {
		return "nothing is allowed"
	}
	return "allowed: " + strings.Join(p.Allow, ", ")
}
