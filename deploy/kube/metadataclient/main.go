// Command metadata-client reads one resource of a Kubernetes API with client-go's
// metadata client and a metadata informer, as controllers that need only metadata do
// (the garbage collector, the namespace controller), and prints what it sees as JSON
// lines on stdout:
//
//	{"list": [{"kind": ..., "apiVersion": ..., "namespace": ..., "name": ..., "resourceVersion": ...}]}
//	{"get": {...}}                      the first listed object, read alone
//	{"type": "ADDED", "name": ..., "resourceVersion": ...}   the informer's events
//	{"type": "SYNCED"}                  once the informer has listed
//
// It runs until its stdin closes. Usage:
//
//	metadata-client SERVER GROUP VERSION RESOURCE [NAMESPACE]
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

type object struct {
	Kind            string `json:"kind"`
	APIVersion      string `json:"apiVersion"`
	Namespace       string `json:"namespace"`
	Name            string `json:"name"`
	ResourceVersion string `json:"resourceVersion"`
}

var out = json.NewEncoder(os.Stdout)
var outLock sync.Mutex

func emit(value any) {
	outLock.Lock()
	defer outLock.Unlock()
	if err := out.Encode(value); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "metadata-client:", err)
	os.Exit(1)
}

func describe(m *metav1.PartialObjectMetadata) object {
	return object{m.Kind, m.APIVersion, m.Namespace, m.Name, m.ResourceVersion}
}

func main() {
	if len(os.Args) < 5 {
		fail(fmt.Errorf("usage: metadata-client SERVER GROUP VERSION RESOURCE [NAMESPACE]"))
	}
	namespace := ""
	if len(os.Args) > 5 {
		namespace = os.Args[5]
	}
	client, err := metadata.NewForConfig(&rest.Config{Host: os.Args[1]})
	if err != nil {
		fail(err)
	}
	gvr := schema.GroupVersionResource{Group: os.Args[2], Version: os.Args[3], Resource: os.Args[4]}
	resource := client.Resource(gvr).Namespace(namespace)

	list, err := resource.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		fail(err)
	}
	listed := []object{}
	for i := range list.Items {
		listed = append(listed, describe(&list.Items[i]))
	}
	emit(map[string]any{"list": listed})
	if len(list.Items) > 0 {
		one, err := resource.Get(context.Background(), list.Items[0].Name, metav1.GetOptions{})
		if err != nil {
			fail(err)
		}
		emit(map[string]any{"get": describe(one)})
	}

	factory := metadatainformer.NewFilteredSharedInformerFactory(client, 0, namespace, nil)
	informer := factory.ForResource(gvr).Informer()
	report := func(kind string) func(any) {
		return func(obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			m := obj.(*metav1.PartialObjectMetadata)
			emit(map[string]string{"type": kind, "name": m.Name, "resourceVersion": m.ResourceVersion})
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    report("ADDED"),
		UpdateFunc: func(_, obj any) { report("MODIFIED")(obj) },
		DeleteFunc: report("DELETED"),
	}); err != nil {
		fail(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, informer.HasSynced) {
		fail(fmt.Errorf("the informer did not sync"))
	}
	emit(map[string]string{"type": "SYNCED"})
	_, _ = io.Copy(io.Discard, os.Stdin)
	close(stop)
	factory.Shutdown()
}
