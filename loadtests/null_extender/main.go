// Command null_extender is the least a scheduler extender can be, for loadtests/scheduler_throughput.py's
// `null-extender` configuration: it speaks the same verbs over the same mTLS as gpu-topology-extender, but filter
// passes every name it is sent, prioritize scores none, bind posts a plain Binding and preempt keeps no victim.
// What kube-scheduler spends with it is what the extender protocol itself costs kube-scheduler: the floor under
// any extender with these verbs.
//
// Build: cd loadtests/null_extender && go build -o /some/dir/null_extender . (the standard library only).
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync/atomic"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve HTTPS on")
	certFile := flag.String("cert", "", "serving certificate")
	keyFile := flag.String("key", "", "serving key")
	clientCA := flag.String("client-ca", "", "CA of the client certificates it requires (kube-scheduler's)")
	api := flag.String("api", "", "API server URL, for bind (no bind without it)")
	apiCert := flag.String("api-cert", "", "client certificate for the API server")
	apiKey := flag.String("api-key", "", "client key for the API server")
	apiCA := flag.String("api-ca", "", "CA of the API server's certificate")
	flag.Parse()

	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/filter", filter)
	mux.HandleFunc("/prioritize", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		answer(w, []struct{}{})
	})
	mux.HandleFunc("/preempt", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		answer(w, map[string]any{"NodeNameToMetaVictims": map[string]any{}})
	})
	if *api != "" {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64,
			TLSClientConfig: &tls.Config{RootCAs: pool(*apiCA), Certificates: []tls.Certificate{keyPair(*apiCert, *apiKey)}}}}
		mux.HandleFunc("/bind", func(w http.ResponseWriter, r *http.Request) { bind(w, r, client, *api) })
	}
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	// The extender's own counter, by the same name, so the harness compares how often kube-scheduler's client
	// opens a connection (a TLS handshake each) to either.
	var opened atomic.Int64
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "gpu_topology_extender_connections_opened_total %d\n", opened.Load())
	})
	server := &http.Server{
		Addr:    *listen,
		Handler: mux,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool(*clientCA),
			ClientAuth: tls.RequireAndVerifyClientCert},
		// HTTP/2 offered beside HTTP/1.1, as gpu-topology-extender serves (and net/http by default): kube-scheduler's
		// client then sends every call as a stream of one connection to either.
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				opened.Add(1)
			}
		},
	}
	log.Fatal(server.ListenAndServeTLS("", ""))
}

func filter(w http.ResponseWriter, r *http.Request) {
	var args struct{ NodeNames *[]string }
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
		answer(w, map[string]any{"Error": err.Error()})
		return
	}
	answer(w, map[string]any{"Nodes": nil, "NodeNames": args.NodeNames, "FailedNodes": map[string]string{},
		"FailedAndUnresolvableNodes": map[string]string{}, "Error": ""})
}

func bind(w http.ResponseWriter, r *http.Request, client *http.Client, api string) {
	var args struct{ PodName, PodNamespace, PodUID, Node string }
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
		answer(w, map[string]string{"Error": err.Error()})
		return
	}
	body, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Binding",
		"metadata": map[string]string{"name": args.PodName, "namespace": args.PodNamespace, "uid": args.PodUID},
		"target":   map[string]string{"kind": "Node", "name": args.Node}})
	path := api + "/api/v1/namespaces/" + url.PathEscape(args.PodNamespace) + "/pods/" + url.PathEscape(args.PodName) +
		"/binding"
	resp, err := client.Post(path, "application/json", bytes.NewReader(body))
	message := ""
	if err != nil {
		message = err.Error()
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			message = "the API server answered " + resp.Status
		}
	}
	answer(w, map[string]string{"Error": message})
}

func answer(w http.ResponseWriter, value any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(value)
}

func pool(path string) *x509.CertPool {
	pem, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	certs := x509.NewCertPool()
	if !certs.AppendCertsFromPEM(pem) {
		log.Fatalf("%s: no certificate", path)
	}
	return certs
}

func keyPair(certFile, keyFile string) tls.Certificate {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		log.Fatal(err)
	}
	return pair
}
