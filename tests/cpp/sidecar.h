// Starts the real sidecar (`python -m igi_sdk.cli serve`, the default model) for the C++ tests
// and waits until it is ready. With IGI_SIDECAR_ENDPOINT_FILE=1 (set by run.sh when `serve`
// has --endpoint-file) it binds port 0 and reports the port in a file, with an instance id;
// otherwise it gets a free port chosen here. The sidecar watches this test process (--game-pid),
// so it never outlives the run.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace igitest {

inline std::string Env(const char* name, const char* fallback = "") {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string(fallback);
}

inline int FreePort() {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
    int port = ntohs(a.sin_port);
    ::close(s);
    return port;
}

inline std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

class Sidecar {
public:
    // port 0: a new one (or the sidecar's own choice with endpoint files)
    explicit Sidecar(const std::string& token = "", int port = 0) : token_(token) {
        static int counter = 0;
        dir_ = Env("IGI_CPP_TMP", "/tmp") + "/sidecar." + std::to_string(::getpid()) + "." + std::to_string(++counter);
        ::mkdir(dir_.c_str(), 0700);
        ::mkdir((dir_ + "/saves").c_str(), 0700);
        use_endpoint_file_ = Env("IGI_SIDECAR_ENDPOINT_FILE") == "1" && port == 0;
        port_ = port != 0 ? port : FreePort();
        instance_ = "cpp" + std::to_string(::getpid()) + "x" + std::to_string(counter);
    }
    ~Sidecar() { Kill(); }

    // Starts it and waits for "ready" (and the endpoint file). False with the log on failure.
    bool Launch(std::string& error, const std::string& save_dir = "") {
        std::string python = Env("IGI_PYTHON", ".venv/bin/python");
        std::string log = dir_ + "/log.txt";
        std::string endpoint_file = dir_ + "/endpoint";
        std::remove(endpoint_file.c_str());
        std::vector<std::string> args = {python, "-m", "igi_sdk.cli", "serve", "--threads", "2", "--ctx", "2048",
                                         "--save-dir", save_dir.empty() ? dir_ + "/saves" : save_dir,
                                         "--game-pid", std::to_string(::getpid())};
        if (use_endpoint_file_) {
            args.insert(args.end(), {"--endpoint", "tcp://127.0.0.1:0", "--endpoint-file", endpoint_file,
                                     "--instance", instance_});
        } else {
            args.insert(args.end(), {"--endpoint", "tcp://127.0.0.1:" + std::to_string(port_)});
        }
        pid_ = ::fork();
        if (pid_ == 0) {
            int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
            ::dup2(fd, 1);
            ::dup2(fd, 2);
            ::unsetenv("IGI_SDK_TOKEN");  // exactly the token asked for
            if (!token_.empty()) ::setenv("IGI_SDK_TOKEN", token_.c_str(), 1);
            std::vector<char*> argv;
            for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
            argv.push_back(nullptr);
            ::execv(argv[0], argv.data());
            _exit(127);
        }
        auto start = std::chrono::steady_clock::now();
        while (true) {
            std::string text = ReadFile(log);
            bool ready = text.find("ready") != std::string::npos;
            if (ready && use_endpoint_file_) {
                std::string ep = ReadFile(endpoint_file);
                while (!ep.empty() && (ep.back() == '\n' || ep.back() == '\r' || ep.back() == ' ')) ep.pop_back();
                if (ep.rfind("tcp://", 0) == 0) { endpoint_ = ep; return true; }
            } else if (ready) {
                endpoint_ = "tcp://127.0.0.1:" + std::to_string(port_);
                return true;
            }
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                error = "the sidecar exited at start:\n" + text;
                return false;
            }
            if (std::chrono::steady_clock::now() - start > std::chrono::seconds(90)) {
                error = "the sidecar was not ready within 90 s:\n" + text;
                Kill();
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }

    // SIGKILL: a crash, no goodbye, no flush.
    void Kill() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }

    bool Running() const { return pid_ > 0 && ::kill(pid_, 0) == 0; }
    const std::string& Endpoint() const { return endpoint_; }
    // the instance the sidecar echoes in hello (empty where the sidecar has no --instance)
    std::string Instance() const { return use_endpoint_file_ ? instance_ : std::string(); }
    int Port() const { return port_; }
    std::string Log() const { return ReadFile(dir_ + "/log.txt"); }
    std::string SaveDir() const { return dir_ + "/saves"; }

private:
    std::string token_;
    std::string dir_;
    std::string endpoint_;
    std::string instance_;
    bool use_endpoint_file_ = false;
    int port_ = 0;
    pid_t pid_ = -1;
};

}  // namespace igitest
