package deploy

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

const defaultPrefillRetries = 1

var pdKnownKeys = []string{
	"enabled", "connector", "devices", "prefill", "decode", "encoder", "kv_buffer_device", "kv_buffer_size",
	"kv_ip", "kv_port", "kv_connector_extra_config", "min_prefill_tokens", "prefill_retries", "fallback",
}

// pdRequest is the pd: section (and the expand flags) as written.
type pdRequest struct {
	// invalid: the section has a mistake that makes expansion meaningless
	// (already reported).
	invalid          bool
	node             *Node
	connector        string
	connectorNode    *Node
	devices          []int
	devicesNode      *Node
	prefill, decode  pdRole
	bufferDevice     string
	bufferSize       *Node
	ip               string
	port             int
	portNode         *Node
	extra            *Node
	minPrefillTokens int
	prefillRetries   int
	fallback         string
	// Where min_prefill_tokens and fallback were written, for errors.
	minPrefillNode, fallbackNode *Node
	// encoder is pd.encoder; nil when absent or disabled.
	encoder *encoderRequest
}

type pdRole struct {
	replicas int
	devices  []int
	port     int
	node     *Node
	// Where num_replicas, devices and kv_port were written, for errors.
	replicasNode, devicesNode, portNode *Node
}

// pdOf reads the pd: section; nil when PD is not asked for.
func (p *problems) pdOf(n *Node, opts Options) *pdRequest {
	req := &pdRequest{node: n, prefillRetries: defaultPrefillRetries}
	enabled := opts.PD
	if n != nil && n.Kind != KindNull {
		enabled = true
		if !p.mapOf(n, "pd") {
			return nil
		}
		for i, k := range n.Keys {
			v := n.Values[i]
			fp := writtenPath(v, "pd."+k.Value)
			switch k.Value {
			case "enabled":
				if b, ok := p.boolOf(v, fp); ok {
					enabled = b || opts.PD
				}
			case "connector":
				req.connector, _ = p.strOf(v, fp)
				req.connectorNode = v
			case "devices":
				req.devices, _ = p.devicesOf(v, fp)
				req.devicesNode = v
			case "prefill":
				req.prefill = p.pdRoleOf(v, fp)
			case "decode":
				req.decode = p.pdRoleOf(v, fp)
			case "encoder":
				req.encoder = p.encoderOf(v, fp)
			case "kv_buffer_device":
				req.bufferDevice, _ = p.strOf(v, fp)
			case "kv_buffer_size":
				if v.Kind != KindScalar || !isNumber(v.Value) {
					p.errorf(v, fp, "want a number of bytes such as 1e9, got %s", describe(v))
				} else {
					req.bufferSize = v
				}
			case "kv_ip":
				req.ip, _ = p.strOf(v, fp)
			case "kv_port":
				req.port, _ = p.portOf(v, fp)
				req.portNode = v
			case "kv_connector_extra_config":
				if v.Kind != KindNull && p.mapOf(v, fp) {
					req.extra = v
				}
			case "min_prefill_tokens":
				req.minPrefillTokens, _ = p.nonNegIntOf(v, fp)
				req.minPrefillNode = v
			case "prefill_retries":
				req.prefillRetries, _ = p.nonNegIntOf(v, fp)
			case "fallback":
				if s, ok := p.strOf(v, fp); ok {
					if s != "none" && s != "local" {
						p.errorf(v, fp, "want none or local, got %q", s)
					} else if s == "local" {
						req.fallback = s
						req.fallbackNode = v
					}
				}
			default:
				p.unknownKey(k, fp, pdKnownKeys)
			}
		}
	}
	if opts.Connector != "" {
		req.connector, req.connectorNode = opts.Connector, nil
	}
	if opts.Devices != "" {
		d, err := topology.ParseDevices(opts.Devices)
		if err != nil {
			p.errs = append(p.errs, Error{Path: "--devices", Msg: err.Error()})
		}
		req.devices, req.devicesNode = d, nil
	}
	if req.connector != "" {
		if _, ok := lookupKVConnector(req.connector); !ok && !knownKVConnector(req.connector) {
			at := req.connectorNode
			path := "pd.connector"
			if at == nil {
				path = "--connector"
			}
			p.errs = append(p.errs, Error{Pos: posOf(at), Path: path,
				Msg: fmt.Sprintf("unknown KV connector %q; omnipd can configure %s", req.connector, quoteAll(KVConnectors()))})
			req.invalid = true
		}
	}
	if opts.Colocated {
		return nil
	}
	if !enabled {
		if req.encoder != nil {
			p.errorf(req.encoder.node, "pd.encoder", "an encoder stage needs the prefill/decode split, which pd.enabled: false turns off: the encoder hands its outputs to the prefill stage; enable pd, or set pd.encoder.enabled: false")
		}
		return nil
	}
	return req
}

func (p *problems) portOf(v *Node, path string) (int, bool) {
	port, ok := p.intOf(v, path)
	if ok && (port < 1 || port > 65535) {
		p.errorf(v, path, "port %d is outside 1-65535", port)
		return 0, false
	}
	return port, ok
}

func (p *problems) pdRoleOf(n *Node, path string) pdRole {
	r := pdRole{node: n}
	if n.Kind == KindNull || !p.mapOf(n, path) {
		return r
	}
	for i, k := range n.Keys {
		v := n.Values[i]
		fp := writtenPath(v, path+"."+k.Value)
		switch k.Value {
		case "num_replicas":
			r.replicas, _ = p.boundedIntOf(v, fp, maxReplicas)
			r.replicasNode = v
		case "devices":
			r.devices, _ = p.devicesOf(v, fp)
			r.devicesNode = v
		case "kv_port":
			r.port, _ = p.portOf(v, fp)
			r.portNode = v
		default:
			p.unknownKey(k, fp, []string{"num_replicas", "devices", "kv_port"})
		}
	}
	return r
}

// expandPD splits the Thinker into a prefill and a decode stage, or, when
// the config already has them, checks that the pd: section agrees. It
// reports whether it split the Thinker.
func expandPD(doc *Document, req *pdRequest, p *problems) bool {
	if e := encoderBesideUnsplit(doc); e != nil {
		// omnipd splits a Thinker only as a whole; an encoder written
		// beside an unsplit Thinker would be left feeding no prefill.
		path := "pd"
		if req.node == nil || req.node.Kind == KindNull {
			path = "--pd"
		}
		p.errorf(req.node, path, "the stages have an encoder stage (stage %d) but no prefill or decode, and omnipd splits the Thinker only as a whole; drop the encoder stage and ask for it with pd.encoder, or write the prefill and decode stages too", e.ID)
		return false
	}
	if doc.Disaggregated() {
		connector := pdConnectorOf(doc)
		if req.connector != "" && connector != "" && req.connector != connector {
			at, path := req.connectorNode, "pd.connector"
			if at == nil {
				path = "--connector"
			}
			p.errs = append(p.errs, Error{Pos: posOf(at), Path: path,
				Msg: fmt.Sprintf("the stages are already disaggregated with %s; %s conflicts (edit the stages' kv_transfer_config instead)", connector, req.connector)})
			return false
		}
		doc.PD = &PDSettings{Connector: connector, Devices: req.devices, MinPrefillTokens: req.minPrefillTokens, PrefillRetries: req.prefillRetries, Fallback: req.fallback, ECConnector: ecConnectorOf(doc)}
		p.decodeOnly(connector, req)
		p.encoderOnSplit(doc, req.encoder)
		return false
	}
	ti := slices.IndexFunc(doc.Stages, func(s *Stage) bool { return s.disaggregatable })
	if ti < 0 {
		p.errs = append(p.errs, Error{Pos: posOf(req.node), Path: "pd", Msg: fmt.Sprintf("pipeline %s has no stage that can be split into prefill and decode", doc.Pipeline)})
		return false
	}
	thinker := doc.Stages[ti]
	if len(thinker.Endpoints) > 0 {
		at, path := fieldAt(thinker, "endpoints")
		p.errorf(at, path, "the Thinker runs at given endpoints, so omnipd cannot split it; write its prefill and decode stages (is_prefill_only, is_decode_only) with their own endpoints")
		return false
	}
	connector := req.connector
	if connector == "" && thinker.KV != nil && thinker.KV.Connector != "" {
		connector = thinker.KV.Connector
	}
	if connector == "" {
		connector = DefaultKVConnector
	}
	spec, ok := lookupKVConnector(connector)
	if !ok && knownKVConnector(connector) {
		// A connector omnipd routes but cannot write (MultiConnector).
		at, path := req.connectorNode, "pd.connector"
		switch {
		case req.connector == "":
			at, path = fieldAt(thinker, "kv_transfer_config.kv_connector")
		case at == nil:
			path = "--connector"
		}
		p.errs = append(p.errs, Error{Pos: posOf(at), Path: path,
			Msg: fmt.Sprintf("omnipd cannot split the Thinker over %s, whose child connectors are the config's to name; write the prefill and decode stages (is_prefill_only, is_decode_only) with their kv_transfer_config, or use one of %s", connector, quoteAll(KVConnectors()))})
		p.decodeOnly(connector, req)
		return false
	}
	if !ok {
		at, path := fieldAt(thinker, "kv_transfer_config.kv_connector")
		p.errorf(at, path, "unknown KV connector %q; omnipd can configure %s", connector, quoteAll(KVConnectors()))
		p.decodeOnly(connector, req)
		return false
	}

	// With an encoder the Thinker becomes three stages (encoder T,
	// prefill T+1, decode T+2), else two (prefill T, decode T+1); the
	// stages after it move up as many ids.
	enc := req.encoder
	var ecSpec ecConnectorSpec
	if enc != nil {
		if ecSpec, ok = p.encoderECConnector(thinker, enc, spec.name); !ok {
			p.decodeOnly(spec.name, req)
			return false
		}
	}
	shift := 1
	if enc != nil {
		shift = 2
	}
	tid := thinker.ID
	remap := func(id int) int {
		if id > tid {
			return id + shift
		}
		return id
	}
	prefill := cloneStage(thinker)
	prefill.ID = tid + shift - 1
	prefill.Role = topology.RolePrefill
	prefill.FinalOutput, prefill.FinalOutputType = false, ""
	prefill.InputSources = []int{}
	prefill.OutputConnectors = nil
	prefill.DefaultSamplingParams = newMap(thinker.src.Pos)
	prefill.NumReplicas = max(req.prefill.replicas, 1)

	decode := cloneStage(thinker)
	decode.Role = topology.RoleDecode
	decode.ID = tid + shift
	decode.InputSources = []int{prefill.ID}
	decode.InputConnectors = nil
	decode.NumReplicas = max(req.decode.replicas, 1)
	for i := range decode.OutputConnectors {
		decode.OutputConnectors[i].Stage = remap(decode.OutputConnectors[i].Stage)
	}

	// Devices, laid out before any stage changes: encoder replicas,
	// prefill replicas, decode replicas, then one set the downstream
	// stages share, from the pool in order; a role the pd: section pins
	// takes its own devices and none of the pool's. Devices per
	// instance: a DP instance runs TP × DP ranks.
	tp := thinker.TensorParallelSize * max(1, thinker.DataParallelSize)
	downSize := 0
	for _, s := range doc.Stages {
		if s != thinker {
			downSize = max(downSize, s.TensorParallelSize*s.NumReplicas)
		}
	}
	lreq := topology.LayoutRequest{
		TensorParallelSize: tp, PrefillReplicas: prefill.NumReplicas, DecodeReplicas: decode.NumReplicas, DownstreamSize: downSize,
		PrefillPinned: req.prefill.devices, DecodePinned: req.decode.devices,
	}
	var encoder *Stage
	if enc != nil {
		encoder = newEncoderStage(thinker, enc)
		encoder.ID = tid
		prefill.InputSources = []int{encoder.ID}
		lreq.EncoderReplicas, lreq.EncoderDevices, lreq.EncoderPinned = encoder.NumReplicas, encoder.TensorParallelSize, enc.devices
	}
	pool := req.devices
	if pool == nil {
		var named []int
		for _, s := range doc.Stages {
			named = append(named, s.Devices...)
		}
		pool = lreq.DefaultPool(named)
	}
	layout, err := topology.AllocatePD(pool, lreq)
	if err != nil {
		var pinned *topology.PinnedError
		var at *Node
		var path string
		switch {
		case errors.As(err, &pinned):
			at = map[topology.Role]*Node{topology.RoleEncoder: enc.devicesNodeOrNil(), topology.RolePrefill: req.prefill.devicesNode, topology.RoleDecode: req.decode.devicesNode}[pinned.Role]
			path = writtenPath(at, "pd."+pinned.Role.String()+".devices")
		case req.devicesNode != nil:
			at, path = req.devicesNode, writtenPath(req.devicesNode, "pd.devices")
		case req.devices != nil:
			path = "--devices"
		default:
			at, path = fieldAt(thinker, "devices")
		}
		p.errs = append(p.errs, Error{Pos: posOf(at), Path: path, Msg: err.Error()})
		p.decodeOnly(spec.name, req)
		return false
	}

	var downstream []*Stage
	for _, s := range doc.Stages {
		if s == thinker {
			continue
		}
		s.ID = remap(s.ID)
		for i, src := range s.InputSources {
			if src == tid {
				s.InputSources[i] = decode.ID
			} else {
				s.InputSources[i] = remap(src)
			}
		}
		for i := range s.InputConnectors {
			c := &s.InputConnectors[i]
			if c.Stage == tid {
				c.Stage = decode.ID
			} else {
				c.Stage = remap(c.Stage)
			}
		}
		for i := range s.OutputConnectors {
			s.OutputConnectors[i].Stage = remap(s.OutputConnectors[i].Stage)
		}
		downstream = append(downstream, s)
	}

	prefill.KV = injectKV(thinker.KV, spec, spec.producerRole, req)
	decode.KV = injectKV(thinker.KV, spec, spec.consumerRole, req)
	if lmcachePD(prefill.KV) {
		spec = lmcachePDSpec(spec)
	}
	for _, side := range []*Stage{prefill, decode} {
		for _, e := range spec.env {
			if side.Env == nil {
				side.Env = newMap(thinker.src.Pos)
			}
			if side.Env.Get(e.key) == nil {
				side.Env.Set(e.key, e.value())
			}
		}
	}
	prefill.KV.EngineID = thinker.ModelStage + "-prefill"
	decode.KV.EngineID = thinker.ModelStage + "-decode"
	if encoder != nil {
		// The encoder's outputs go to the prefill alone: the decode
		// rebuilds the request without running any encoder.
		encoder.EC = injectEC(thinker.EC, ecSpec, encoderECRole, enc)
		encoder.EC.EngineID = cmp.Or(enc.engineID, thinker.ModelStage+"-encoder")
		prefill.EC = injectEC(thinker.EC, ecSpec, prefillECRole, enc)
		decode.EC = nil
		setEncoderReplicas(encoder, layout.Encoder)
	}

	prefillPort := firstNonZero(req.prefill.port, req.port, spec.basePort)
	decodePort := 0
	if spec.decodeListens {
		decodePort = firstNonZero(req.decode.port, prefillPort+prefill.NumReplicas*kvPortStride(spec, prefill.TensorParallelSize, prefill.DataParallelSize))
	}
	if spec.prefillConnects {
		prefillPort, decodePort = 0, firstNonZero(req.decode.port, req.port, spec.basePort)
	}
	setReplicas(prefill, layout.Prefill, prefillPort, spec)
	setReplicas(decode, layout.Decode, decodePort, spec)
	if lmcachePD(prefill.KV) {
		writeLMCachePD(prefill, decode)
	}
	// The decode's ports count on from the prefill's only as a default:
	// pd.kv_port chooses both, pd.prefill.kv_port only the prefill's.
	prefill.kvPortsDefaulted = req.prefill.port == 0 && req.port == 0
	decode.kvPortsDefaulted = req.decode.port == 0 && req.port == 0
	for _, s := range downstream {
		if layout.Downstream == nil {
			continue
		}
		n := s.TensorParallelSize * s.NumReplicas
		devs := layout.Downstream[:min(n, len(layout.Downstream))]
		for i := range s.Replicas {
			s.Replicas[i].Devices = slices.Clone(devs[min(i*s.TensorParallelSize, len(devs)):min((i+1)*s.TensorParallelSize, len(devs))])
		}
		s.Devices = unionDevices(s.Replicas)
	}

	prefill.origins = req.prefill.origins(req)
	decode.origins = req.decode.origins(req)
	if encoder != nil {
		encoder.origins = enc.origins()
	}

	stages := append([]*Stage{}, doc.Stages[:ti]...)
	if encoder != nil {
		stages = append(stages, encoder)
	}
	stages = append(stages, prefill, decode)
	stages = append(stages, doc.Stages[ti+1:]...)
	doc.Stages = stages
	doc.PD = &PDSettings{Connector: spec.name, Devices: pool, MinPrefillTokens: req.minPrefillTokens, PrefillRetries: req.prefillRetries, Fallback: req.fallback, ECConnector: ecSpec.name}
	p.decodeOnly(spec.name, req)
	return true
}

// origins are the pd: values a prefill or decode stage made by expansion
// took its fields from.
func (r pdRole) origins(req *pdRequest) map[string]*Node {
	o := map[string]*Node{}
	if r.devicesNode != nil {
		o["devices"], o["replicas.devices"] = r.devicesNode, r.devicesNode
	}
	if r.replicasNode != nil {
		o["num_replicas"] = r.replicasNode
	}
	if port := cmp.Or(r.portNode, req.portNode); port != nil {
		o["replicas.kv_port"] = port
	}
	return o
}

// encoderBesideUnsplit is the encoder stage of stages that have one but
// no prefill or decode, which PD expansion cannot split; nil otherwise.
func encoderBesideUnsplit(doc *Document) *Stage {
	e := doc.EncoderStage()
	if e == nil || slices.ContainsFunc(doc.Stages, func(s *Stage) bool {
		return s.Role == topology.RolePrefill || s.Role == topology.RoleDecode
	}) {
		return nil
	}
	return e
}

// decodeOnlyHangs are the connectors whose decode engine cannot serve a
// request no prefill ran for, with what it does instead
// (kvconnector.Spec.ClaimsEveryPrompt and DecodeAlone): their consumers
// claim the prompt's KV on every request whatever kv_transfer_params say.
var decodeOnlyHangs = func() map[string]string {
	m := map[string]string{}
	for _, s := range kvconnector.Specs() {
		if s.ClaimsEveryPrompt {
			m[s.Name] = s.DecodeAlone
		}
	}
	return m
}()

// decodeOnly refuses the pd: settings that send a request to the decode
// without a prefill (min_prefill_tokens, fallback: local) for the
// connectors whose decode cannot take one.
func (p *problems) decodeOnly(connector string, req *pdRequest) {
	why, ok := decodeOnlyHangs[connector]
	if !ok {
		return
	}
	if req.minPrefillTokens > 0 {
		p.errorf(req.minPrefillNode, "pd.min_prefill_tokens", "%d sends short prompts to the decode alone, and %s; remove it, or use a connector whose decode can prefill (NixlConnector, MooncakeConnector)", req.minPrefillTokens, why)
	}
	if req.fallback == "local" {
		p.errorf(req.fallbackNode, "pd.fallback", "local sends the request to the decode alone when the prefill failed, and %s; use none, or a connector whose decode can prefill (NixlConnector, MooncakeConnector)", why)
	}
}

func firstNonZero(xs ...int) int {
	for _, x := range xs {
		if x != 0 {
			return x
		}
	}
	return 0
}

func setReplicas(s *Stage, sets [][]int, basePort int, spec kvConnectorSpec) {
	s.Replicas = make([]topology.Replica, s.NumReplicas)
	for i := range s.Replicas {
		r := &s.Replicas[i]
		if i < len(sets) {
			r.Devices = slices.Clone(sets[i])
		}
		r.EngineID = s.KV.EngineID
		if s.NumReplicas > 1 {
			r.EngineID = fmt.Sprintf("%s-%d", s.KV.EngineID, i)
		}
		if basePort > 0 {
			r.KVPort = basePort + i*kvPortStride(spec, s.TensorParallelSize, s.DataParallelSize)
		}
	}
	if basePort > 0 {
		if spec.portInExtra {
			if s.KV.ExtraConfig == nil {
				s.KV.ExtraConfig = newMap(Pos{})
			}
			s.KV.ExtraConfig.Set(spec.portKey, newInt(basePort, Pos{}))
			if spec.notifyKey != "" {
				s.KV.ExtraConfig.Set(spec.notifyKey, newInt(basePort+max(1, s.TensorParallelSize), Pos{}))
			}
		} else {
			s.KV.Port = basePort
		}
	}
	s.Endpoints = nil
	s.Devices = unionDevices(s.Replicas)
}

// injectKV builds one side's kv_transfer_config: the Thinker's own settings
// (if it had any), then the pd: section, then the connector's role.
func injectKV(base *KVConfig, spec kvConnectorSpec, role string, req *pdRequest) *KVConfig {
	kv := base.clone()
	if kv == nil || kv.Connector != spec.name {
		kv = &KVConfig{}
	}
	kv.Connector = spec.name
	kv.Role = role
	if req.bufferDevice != "" {
		kv.BufferDevice = req.bufferDevice
	} else if kv.BufferDevice == "" {
		kv.BufferDevice = spec.bufferDevice
	}
	if req.bufferSize != nil {
		kv.BufferSize = req.bufferSize.Clone()
	}
	if req.ip != "" {
		kv.IP = req.ip
	} else if kv.IP == "" {
		kv.IP = spec.ip
	}
	if req.extra != nil {
		kv.ExtraConfig = mergeNodes(kv.ExtraConfig, req.extra)
	}
	for _, e := range spec.extra {
		if kv.ExtraConfig == nil {
			kv.ExtraConfig = newMap(Pos{})
		}
		if kv.ExtraConfig.Get(e.key) == nil {
			kv.ExtraConfig.Set(e.key, e.value())
		}
	}
	return kv
}

func cloneStage(s *Stage) *Stage {
	c := *s
	c.InputSources = slices.Clone(s.InputSources)
	c.Devices = slices.Clone(s.Devices)
	c.Replicas = nil
	for _, r := range s.Replicas {
		r.Devices = slices.Clone(r.Devices)
		c.Replicas = append(c.Replicas, r)
	}
	c.KV = s.KV.clone()
	c.InputConnectors = slices.Clone(s.InputConnectors)
	c.OutputConnectors = slices.Clone(s.OutputConnectors)
	c.DefaultSamplingParams = s.DefaultSamplingParams.Clone()
	c.Env = s.Env.Clone()
	c.EngineArgs = s.EngineArgs.Clone()
	c.Endpoints = slices.Clone(s.Endpoints)
	return &c
}
