package minipy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
)

// EgressRules narrow the engine's egress policy (IsolatedConfig.Egress) for one namespace's
// sandbox, as E2B's network rules do (allowOut, denyOut): a destination passes the sandbox's
// rules when Allow names it, else when Deny does not. They never widen the engine's policy,
// which still judges every destination first (its Allow, Deny and address rule: no rule of
// a sandbox reaches the host's or private addresses the engine refuses).
type EgressRules struct {
	// Allow names destinations that pass whatever Deny says: host names ("example.com",
	// "*.example.com"), addresses ("1.1.1.1") and CIDR prefixes ("10.1.0.0/16"); any port.
	Allow []string
	// Deny names addresses and CIDR prefixes refused unless Allow names them ("0.0.0.0/0"
	// or "*": everything else, IPv6 too; E2B's allowInternetAccess false).
	Deny []string
}

// ErrNoEgress is matched by Namespace.SetEgressRules's error for a namespace whose sandbox
// has no egress proxy to narrow: an engine made without IsolatedConfig.Egress (its sandboxes
// reach nothing outside, whatever the rules), or a namespace without a sandbox of its own.
var ErrNoEgress = errors.New("minipy: the namespace's sandbox has no egress proxy (IsolatedConfig.Egress) of its own")

// Check reports whether the rules are well formed, as SetEgressRules would.
func (r EgressRules) Check() error {
	_, err := parseEgressRules(r)
	return err
}

// egressRules are EgressRules parsed.
type egressRules struct {
	names           []destination // Allow's names (matchesName: any port)
	allow, deny     []netip.Prefix
	denyAll         bool
	allowed, denied string // for a refusal's line
}

// parseEgressRules checks r.
func parseEgressRules(r EgressRules) (*egressRules, error) {
	out := &egressRules{allowed: strings.Join(r.Allow, ", "), denied: strings.Join(r.Deny, ", ")}
	for _, s := range r.Allow {
		if p, ok := parsePrefix(s); ok {
			out.allow = append(out.allow, p)
			continue
		}
		d, err := parseDestination(s)
		if err != nil || d.ports != nil {
			return nil, fmt.Errorf("minipy: EgressRules.Allow: %q is no name, address or CIDR prefix", s)
		}
		out.names = append(out.names, d)
	}
	for _, s := range r.Deny {
		p, ok := parsePrefix(s)
		switch {
		case strings.TrimSpace(s) == "*":
			out.denyAll = true
		case !ok:
			return nil, fmt.Errorf("minipy: EgressRules.Deny: %q is no address or CIDR prefix (names are Allow's alone)", s)
		case p.Bits() == 0:
			out.denyAll = true // (0.0.0.0/0 is E2B's "all traffic": IPv6 goes too)
		default:
			out.deny = append(out.deny, p)
		}
	}
	return out, nil
}

// parsePrefix reads an address ("1.1.1.1", a /32) or a CIDR prefix.
func parsePrefix(s string) (netip.Prefix, bool) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), true
	}
	return netip.Prefix{}, false
}

// allowsName reports whether Allow names host.
func (r *egressRules) allowsName(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	return slices.ContainsFunc(r.names, func(d destination) bool { return d.matchesName(h) })
}

// admits judges an address: Allow's prefixes pass it, else Deny's refuse it.
func (r *egressRules) admits(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range r.allow {
		if p.Contains(a) {
			return true
		}
	}
	if r.denyAll {
		return false
	}
	for _, p := range r.deny {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// judge keeps the addresses of host that the rules pass (all of them when Allow names host).
func (r *egressRules) judge(host string, addrs []netip.Addr) []netip.Addr {
	if r == nil || r.allowsName(host) {
		return addrs
	}
	var ok []netip.Addr
	for _, a := range addrs {
		if r.admits(a) {
			ok = append(ok, a)
		}
	}
	return ok
}

// why is a refusal's reason.
func (r *egressRules) why() string {
	return fmt.Sprintf("the sandbox's rules: allowed %q, denied %q", r.allowed, r.denied)
}

// SetEgressRules narrows the egress of the namespace's sandbox by r (nil: the engine's
// policy alone), from its next connection on (a tunnel open stays): E2B's network rules,
// at create and updateNetwork. Only an engine made with IsolatedConfig.Egress has a proxy to
// narrow, and only a namespace with a sandbox of its own; the rules last as its sandbox
// does (a new worker after a loss keeps them) and are shared by its Fork copies.
func (ns *Namespace) SetEgressRules(r *EgressRules) error {
	var rules *egressRules
	if r != nil {
		var err error
		if rules, err = parseEgressRules(*r); err != nil {
			return err
		}
	}
	e, err := ns.isolated(ErrNoEgress, "its network is the host's")
	if err != nil {
		return err
	}
	b := bindingOf(ns)
	if e.egress.Load() == nil || b == nil || !b.slot.own || !e.sandbox {
		return ErrNoEgress
	}
	if b.dirs.tree == nil {
		return fmt.Errorf("minipy: SetEgressRules: the namespace has no sandbox: %w", b.dirs.err)
	}
	b.dirs.tree.egress.Store(rules)
	return nil
}

// treeRules is where a tree's rules are kept (nil for a worker of no tree).
func treeRules(d workDirs) *atomic.Pointer[egressRules] {
	if d.tree == nil {
		return nil
	}
	return &d.tree.egress
}
