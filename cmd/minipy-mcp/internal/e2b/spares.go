package e2b

import (
	"maps"
	"time"
)

// Warm spares of templates: a sandbox of a template build (a snapshot of one, templateID
// set) restored and started ahead, its start command running and ready, so that the next
// create of that build is served at once (E2B resumes a template's memory, its processes
// running: minipy restores its files and variables and runs its start command again, which
// takes the restore's milliseconds and the start command's own time). A spare is made after
// each create of a build, one per build; taken by a create that asks nothing of its own
// (no envs, network rules, autoPause: those shape a sandbox as it starts), which gets its
// metadata and life then; killed when not taken in spareIdle, when its build is dropped, at
// its user's revocation, and when the server closes. A spare holds no place under the
// server's caps (Config.Admit): its contexts take theirs when it is taken (refused: it is
// killed, and the create goes the usual way, to the same refusal), so spares never keep a
// sandbox or a context from being made; they are the server's, as the engine's warm pool
// is, at most maxSpares at once (maxSparesPerUser a user's).

const (
	maxSpares        = 4
	maxSparesPerUser = 2
	spareIdle        = 5 * time.Minute
)

// spare is a template build's warm sandbox (key: spareKey), or one being made (sb nil).
type spare struct {
	sb    *sandbox
	user  string
	snap  string // its snapshot's id
	timer *time.Timer
}

// spareKey is the key of user's spare of the snapshot of id.
func spareKey(user, id string) string { return user + "\x00" + id }

// plainCreate reports whether req asks nothing that shapes a sandbox as it starts, which a
// spare could not have: a spare may serve it.
func plainCreate(req *createRequest) bool {
	return len(req.EnvVars) == 0 && req.Network == nil && req.AllowInternetAccess == nil &&
		(req.AutoPause == nil || !*req.AutoPause) && req.AutoPauseMemory == nil
}

// takeSpare is user's spare of sn for req, made one of the server's sandboxes with req's
// metadata and life; nil when there is none that may serve it.
func (s *Server) takeSpare(user string, sn *snapshot, req *createRequest, life time.Duration) *sandbox {
	if sn.templateID == "" || !plainCreate(req) {
		return nil
	}
	key := spareKey(user, sn.id)
	s.mu.Lock()
	sp := s.spares[key]
	if sp == nil || sp.sb == nil {
		s.mu.Unlock()
		return nil
	}
	delete(s.spares, key)
	s.mu.Unlock()
	sp.timer.Stop()
	sb := sp.sb
	if !s.placeSpare(sb) {
		s.kill(sb, "its user has no place for it")
		return nil
	}
	now := time.Now()
	sb.mu.Lock()
	sb.metadata = maps.Clone(req.Metadata)
	if sb.metadata == nil {
		sb.metadata = map[string]string{}
	}
	sb.started, sb.end = now, now.Add(life)
	sb.mu.Unlock()
	if code, _ := s.register(sb, life); code != 0 {
		return nil // (closed: register closed it)
	}
	s.mu.Lock()
	s.stats.FromSpare++
	s.mu.Unlock()
	return sb
}

// refillSpare makes user's spare of sn in the background, if it is a template build's,
// there is none, and the bounds allow.
func (s *Server) refillSpare(user string, sn *snapshot) {
	if sn.templateID == "" {
		return
	}
	key := spareKey(user, sn.id)
	s.mu.Lock()
	mine := 0
	for _, sp := range s.spares {
		if sp.user == user {
			mine++
		}
	}
	if s.closed || s.spares[key] != nil || len(s.spares) >= maxSpares || mine >= maxSparesPerUser {
		s.mu.Unlock()
		return
	}
	sp := &spare{user: user, snap: sn.id}
	s.spares[key] = sp // (being made: no other)
	s.sparing.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.sparing.Done()
		sb, _, why := s.snapshotSandbox(user, sn, &createRequest{spare: true}, s.cfg.MaxTimeout)
		if sb != nil {
			if code, why2 := s.startTemplate(sb); code != 0 {
				s.kill(sb, "its template's start command failed")
				sb, why = nil, why2
			}
		}
		s.mu.Lock()
		if sb == nil || s.closed || s.spares[key] != sp {
			if s.spares[key] == sp {
				delete(s.spares, key)
			}
			s.mu.Unlock()
			if sb != nil {
				s.kill(sb, "its spare was not wanted any more")
			} else {
				s.logf("minipy-mcp: E2B: no warm spare of snapshot %s of user %q: %s", sn.id, user, why)
			}
			return
		}
		sp.sb = sb
		sp.timer = time.AfterFunc(spareIdle, func() { s.dropSpares(func(o *spare) bool { return o == sp }) })
		s.mu.Unlock()
	}()
}

// placeSpare gives each of the spare sb's contexts its place again, as it is taken; false,
// holding none, when its user's caps refuse one.
func (s *Server) placeSpare(sb *sandbox) bool {
	releases := make([]func(), 0, len(sb.contexts))
	for range sb.contexts {
		release, refusal := s.admit(sb.user)
		if refusal != "" {
			for _, r := range releases {
				r()
			}
			return false
		}
		releases = append(releases, release)
	}
	for i, cc := range sb.contexts { // (no one else has the spare: taken out of s.spares)
		cc.release = releases[i]
	}
	sb.mu.Lock()
	sb.spare = false
	sb.mu.Unlock()
	return true
}

// dropSpares kills the spares that match, made or being made (those being made are killed
// as they are ready); it returns how many it dropped.
func (s *Server) dropSpares(match func(*spare) bool) int {
	s.mu.Lock()
	var made []*sandbox
	n := 0
	for key, sp := range s.spares {
		if match(sp) {
			delete(s.spares, key)
			n++
			if sp.sb != nil {
				sp.timer.Stop()
				made = append(made, sp.sb)
			}
		}
	}
	s.mu.Unlock()
	for _, sb := range made {
		s.kill(sb, "a warm spare dropped")
	}
	return n
}
