package check

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "../kafka-delay"

// valuesFiles are the shipped values files: the chart's defaults and each file under ci/.
func valuesFiles(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join(chartDir, "values.yaml")}, files...)
}

func load(t *testing.T) *chart.Chart {
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return c
}

// render is `helm template` of the chart with the values of `file` over the defaults, plus
// `set`: the manifests by template name.
func render(t *testing.T, file string, set map[string]any) (map[string]string, error) {
	c := load(t)
	vals, err := chartutil.ReadValuesFile(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	vals = chartutil.CoalesceTables(set, vals.AsMap())
	opts := chartutil.ReleaseOptions{Name: "kd", Namespace: "delays", IsInstall: true}
	top, err := chartutil.ToRenderValues(c, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return engine.Render(c, top)
}

// objects are the rendered manifests split into documents, without empty ones and NOTES.txt.
func objects(t *testing.T, manifests map[string]string) []string {
	names := make([]string, 0, len(manifests))
	for name := range manifests {
		names = append(names, name)
	}
	sort.Strings(names)
	var docs []string
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(manifests[name], -1) {
			if strings.TrimSpace(stripComments(doc)) != "" {
				docs = append(docs, doc)
			}
		}
	}
	return docs
}

func stripComments(doc string) string {
	var out []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// rendered holds a render's objects, decoded.
type rendered struct {
	statefulSet *appsv1.StatefulSet
	services    []corev1.Service
	secrets     []corev1.Secret
	pdb         *policyv1.PodDisruptionBudget
	monitors    int
}

// decode reads every document into its API type, refusing unknown fields and unknown kinds.
func decode(t *testing.T, file string, docs []string) rendered {
	var r rendered
	for _, doc := range docs {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: not YAML: %v\n%s", file, err, doc)
		}
		strict := func(into any) {
			if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
				t.Fatalf("%s: %s %s does not decode strictly: %v\n%s", file, meta.APIVersion, meta.Kind, err, doc)
			}
		}
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 StatefulSet":
			r.statefulSet = &appsv1.StatefulSet{}
			strict(r.statefulSet)
		case "v1 Service":
			var s corev1.Service
			strict(&s)
			r.services = append(r.services, s)
		case "v1 Secret":
			var s corev1.Secret
			strict(&s)
			r.secrets = append(r.secrets, s)
		case "policy/v1 PodDisruptionBudget":
			r.pdb = &policyv1.PodDisruptionBudget{}
			strict(r.pdb)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			// A CRD: no Go type in k8s.io/api; its fields are checked by name below.
			var m struct {
				APIVersion string            `json:"apiVersion"`
				Kind       string            `json:"kind"`
				Metadata   metav1.ObjectMeta `json:"metadata"`
				Spec       struct {
					Selector  metav1.LabelSelector `json:"selector"`
					Endpoints []struct {
						Port     string `json:"port"`
						Path     string `json:"path"`
						Interval string `json:"interval"`
					} `json:"endpoints"`
				} `json:"spec"`
			}
			strict(&m)
			r.monitors++
		default:
			t.Fatalf("%s: an object of an unexpected kind: %s %s", file, meta.APIVersion, meta.Kind)
		}
	}
	if r.statefulSet == nil {
		t.Fatalf("%s: no StatefulSet", file)
	}
	return r
}

func env(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

func TestTheChartLintsClean(t *testing.T) {
	for _, file := range valuesFiles(t) {
		vals, err := chartutil.ReadValuesFile(file)
		if err != nil {
			t.Fatal(err)
		}
		linter := lint.AllWithKubeVersion(chartDir, vals.AsMap(), "delays", nil)
		for _, m := range linter.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: helm lint: %s", file, m)
			}
		}
	}
}

func TestEveryShippedValuesFileRendersObjectsTheKubernetesTypesAccept(t *testing.T) {
	for _, file := range valuesFiles(t) {
		manifests, err := render(t, file, nil)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		r := decode(t, file, objects(t, manifests))
		ss := r.statefulSet
		pod := ss.Spec.Template.Spec
		if len(pod.Containers) != 1 {
			t.Fatalf("%s: %d containers", file, len(pod.Containers))
		}
		c := pod.Containers[0]
		e := env(c)
		// Stable ids and a volume per pod.
		if e["KAFKA_DELAY_INSTANCE_ID"].Value != "$(POD_NAME)" || e["POD_NAME"].ValueFrom == nil ||
			e["POD_NAME"].ValueFrom.FieldRef.FieldPath != "metadata.name" {
			t.Errorf("%s: the instance id is not the pod's name: %+v", file, e["KAFKA_DELAY_INSTANCE_ID"])
		}
		if len(ss.Spec.VolumeClaimTemplates) != 1 || c.VolumeMounts[0].MountPath != e["KAFKA_DELAY_DATA_DIR"].Value {
			t.Errorf("%s: RocksDB is not on the pod's own volume", file)
		}
		// Where the others reach it: its name in the headless service.
		headless := ss.Spec.ServiceName
		if !slices.ContainsFunc(r.services, func(s corev1.Service) bool {
			return s.Name == headless && s.Spec.ClusterIP == corev1.ClusterIPNone
		}) {
			t.Errorf("%s: no headless service %s", file, headless)
		}
		if want := "$(POD_NAME)." + headless + ".$(POD_NAMESPACE).svc:9464"; e["KAFKA_DELAY_ADVERTISED_HTTP_ADDR"].Value != want {
			t.Errorf("%s: advertised address %q, want %q", file, e["KAFKA_DELAY_ADVERTISED_HTTP_ADDR"].Value, want)
		}
		// Probes, and a grace period that covers the preStop wait and the handoff.
		if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
			t.Errorf("%s: probes %q and %q", file, c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
		}
		if *pod.TerminationGracePeriodSeconds < 5+10+30 || e["KAFKA_DELAY_HANDOFF_WAIT"].Value != "10s" {
			t.Errorf("%s: grace period %d s for a 5 s preStop and a 10 s handoff", file, *pod.TerminationGracePeriodSeconds)
		}
		if pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
			t.Errorf("%s: runs as root", file)
		}
	}
}

func TestTheDefaultsRunThreeInstancesWithTheChangelogAndScrapedMetrics(t *testing.T) {
	file := filepath.Join(chartDir, "values.yaml")
	manifests, err := render(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, file, objects(t, manifests))
	ss := r.statefulSet
	e := env(ss.Spec.Template.Spec.Containers[0])
	if *ss.Spec.Replicas != 3 || e["KAFKA_DELAY_CHANGELOG"].Value != "true" || e["KAFKA_DELAY_STANDBY_REPLICAS"].Value != "1" {
		t.Errorf("replicas %d, changelog %q, standbys %q", *ss.Spec.Replicas, e["KAFKA_DELAY_CHANGELOG"].Value, e["KAFKA_DELAY_STANDBY_REPLICAS"].Value)
	}
	// Values pointed at where the delay topic keeps them, killed pods removed from the group.
	_, copied := e["KAFKA_DELAY_CHANGELOG_COPY_VALUES"]
	_, slow := e["KAFKA_DELAY_NO_FAST_TAKEOVER"]
	if copied || slow || e["KAFKA_DELAY_CHANGELOG_COPY_MARGIN"].Value != "1d" {
		t.Errorf("copy values %v, no fast takeover %v, copy margin %q", copied, slow, e["KAFKA_DELAY_CHANGELOG_COPY_MARGIN"].Value)
	}
	if r.pdb == nil || r.pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget: %+v", r.pdb)
	}
	if ss.Spec.Template.Annotations["prometheus.io/scrape"] != "true" || ss.Spec.Template.Annotations["prometheus.io/port"] != "9464" {
		t.Errorf("scrape annotations: %v", ss.Spec.Template.Annotations)
	}
	if _, ok := e["KAFKA_DELAY_ADMIN_TOKEN"]; ok || len(r.secrets) != 0 {
		t.Error("an admin token without one given")
	}
}

func TestTheSecuredValuesReachThePodAsKafkaDelayReadsThem(t *testing.T) {
	file := filepath.Join(chartDir, "ci", "secured-values.yaml")
	manifests, err := render(t, file, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, file, objects(t, manifests))
	c := r.statefulSet.Spec.Template.Spec.Containers[0]
	e := env(c)
	// Regexes keep their backslashes through YAML.
	wantArgs := []string{"run", "--route", `delay\.team-a\..*=^team-a\.`, "--route", `delay\.team-b\..*=^team-b\.`,
		"--retry-policy", `^team-a\.payments$=backoff=fixed,delay=30s,max-attempts=20`, "--fire-rate", `^team-b\.emails$=100/s`}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("args %q, want %q", c.Args, wantArgs)
	}
	if e["KAFKA_DELAY_SOURCE_PATTERN"].Value != `^delay\..+` {
		t.Errorf("source pattern %q", e["KAFKA_DELAY_SOURCE_PATTERN"].Value)
	}
	props := strings.Split(e["KAFKA_DELAY_KAFKA_CONFIG"].Value, ";")
	for _, want := range []string{"security.protocol=SASL_SSL", "sasl.mechanism=SCRAM-SHA-512", "sasl.password=$(SASL_PASSWORD)"} {
		if !slices.Contains(props, want) {
			t.Errorf("kafka config %q lacks %q", props, want)
		}
	}
	pw := e["SASL_PASSWORD"].ValueFrom
	if pw == nil || pw.SecretKeyRef.Name != "kafka-delay" || pw.SecretKeyRef.Key != "password" {
		t.Errorf("the SASL password is not from its Secret: %+v", pw)
	}
	// $(SASL_PASSWORD) expands only when SASL_PASSWORD comes first.
	names := make([]string, len(c.Env))
	for i, v := range c.Env {
		names[i] = v.Name
	}
	if slices.Index(names, "SASL_PASSWORD") > slices.Index(names, "KAFKA_DELAY_KAFKA_CONFIG") {
		t.Errorf("SASL_PASSWORD after the config that names it: %v", names)
	}
	if e["KAFKA_DELAY_EXACTLY_ONCE"].Value != "true" || r.monitors != 1 || len(r.secrets) != 1 {
		t.Errorf("exactly-once %q, service monitors %d, secrets %d", e["KAFKA_DELAY_EXACTLY_ONCE"].Value, r.monitors, len(r.secrets))
	}
	token := e["KAFKA_DELAY_ADMIN_TOKEN"].ValueFrom
	if token == nil || token.SecretKeyRef.Name != r.secrets[0].Name {
		t.Errorf("the admin token is not from the chart's Secret: %+v", token)
	}
}

func TestTheChangelogsValueCopiesAndTakeoverReachThePod(t *testing.T) {
	file := filepath.Join(chartDir, "values.yaml")
	set := map[string]any{"changelog": map[string]any{"copyValues": true, "copyMargin": "2d", "fastTakeover": false}}
	manifests, err := render(t, file, set)
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, file, objects(t, manifests))
	e := env(r.statefulSet.Spec.Template.Spec.Containers[0])
	if e["KAFKA_DELAY_CHANGELOG_COPY_VALUES"].Value != "true" || e["KAFKA_DELAY_NO_FAST_TAKEOVER"].Value != "true" || e["KAFKA_DELAY_CHANGELOG_COPY_MARGIN"].Value != "2d" {
		t.Errorf("copy values %q, no fast takeover %q, copy margin %q", e["KAFKA_DELAY_CHANGELOG_COPY_VALUES"].Value,
			e["KAFKA_DELAY_NO_FAST_TAKEOVER"].Value, e["KAFKA_DELAY_CHANGELOG_COPY_MARGIN"].Value)
	}
}

func TestAConfigurationKafkaDelayWouldRefuseFailsToRenderSayingWhy(t *testing.T) {
	file := filepath.Join(chartDir, "values.yaml")
	for _, c := range []struct {
		set  map[string]any
		says string
	}{
		{map[string]any{"changelog": map[string]any{"enabled": false}}, "set replicas to 1"},
		{map[string]any{"changelog": map[string]any{"enabled": false}, "replicas": 1, "exactlyOnce": true}, "exactlyOnce needs the changelog"},
		{map[string]any{"adminToken": map[string]any{"value": "short"}}, "at least 16 characters"},
	} {
		_, err := render(t, file, c.set)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%v: got %v, want an error saying %q", c.set, err, c.says)
		}
	}
	if _, err := os.Stat(filepath.Join(chartDir, "ci", "single-values.yaml")); err != nil {
		t.Fatal(err)
	}
}
