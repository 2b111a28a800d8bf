// trainhub-fake-gpu: a Kubernetes device plugin that advertises simulated GPUs.
//
// It speaks the kubelet's device plugin API (v1beta1) exactly as the NVIDIA device plugin does:
// it serves the DevicePlugin service on a socket in the kubelet's device-plugins folder and
// registers its resource name (default nvidia.com/gpu) with the kubelet, which then advertises
// the devices in the node's capacity, counts them in the scheduler's view and calls Allocate for
// each container that requests them. No device node exists: Allocate only sets
// NVIDIA_VISIBLE_DEVICES (the ids the kubelet chose) and TRAINHUB_SIMULATED_GPUS, so a pod can
// show which simulated devices it was given. Built by tests/kubernetes/controlplane/build.sh
// from the same Kubernetes tree as the kubelet (its vendored gRPC and API packages).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	devices []*pluginapi.Device
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done() // the devices never change; the kubelet closes the stream when it stops
	return nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		ids := strings.Join(c.DevicesIDs, ",")
		fmt.Printf("allocate %s\n", ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids, "TRAINHUB_SIMULATED_GPUS": ids},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func dialUnix(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", addr)
}

// register tells the kubelet (its socket in dir) about the plugin's socket and resource.
func register(dir, socket, resource string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, filepath.Join(dir, "kubelet.sock"), grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(dialUnix))
	if err != nil {
		return fmt.Errorf("dial the kubelet: %v", err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: socket, ResourceName: resource,
	})
	return err
}

func inode(path string) uint64 {
	info, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return info.Sys().(*syscall.Stat_t).Ino
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugins folder (<kubelet root dir>/device-plugins)")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name to advertise")
	count := flag.Int("count", 2, "number of simulated devices")
	prefix := flag.String("prefix", "sim-gpu-", "device id prefix")
	flag.Parse()

	p := &plugin{}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("%s%d", *prefix, i), Health: pluginapi.Healthy})
	}
	socket := "trainhub-fake-gpu-" + strings.NewReplacer("/", "-", ".", "-").Replace(*resource) + ".sock"
	path := filepath.Join(*dir, socket)
	os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "listen on %s: %v\n", path, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go server.Serve(lis)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	// (re-)register whenever the kubelet's socket is new: a restarted kubelet forgets its plugins
	registered := uint64(0)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if ino := inode(filepath.Join(*dir, "kubelet.sock")); ino != 0 && ino != registered {
			if err := register(*dir, socket, *resource); err != nil {
				fmt.Fprintf(os.Stderr, "register %s: %v\n", *resource, err)
			} else {
				registered = ino
				fmt.Printf("registered %d x %s at %s\n", *count, *resource, path)
			}
		}
		select {
		case <-stop:
			server.Stop()
			os.Remove(path)
			return
		case <-tick.C:
		}
	}
}
