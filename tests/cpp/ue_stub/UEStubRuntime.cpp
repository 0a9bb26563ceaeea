// The bodies of the UE stub's platform functions (UEStub.h), on POSIX, so the plugin's Unreal
// layer links and runs in tests/cpp/test_unreal_layer.cpp: processes are real child processes
// (posix_spawn, waitpid), files and directories real files, GUIDs random.
#include "CoreMinimal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

extern char** environ;

const FName NAME_Stream;
static UEngine GStubEngine;
UEngine* GEngine = &GStubEngine;
bool GStubIsDedicatedServer = false;
FString GStubProjectDir;

std::map<const void*, uint64>& StubLiveObjects() {
    static std::map<const void*, uint64> live;
    return live;
}

uint64 StubNextSerial() {
    static uint64 serial = 0;
    return ++serial;
}

namespace {

std::string Narrow(const std::u16string& s) {
    // the paths and arguments here are ASCII; other characters pass through UTF-8
    std::string out;
    for (char16_t c : s) {
        if (c < 0x80) out.push_back(static_cast<char>(c));
        else if (c < 0x800) { out.push_back(static_cast<char>(0xC0 | (c >> 6))); out.push_back(static_cast<char>(0x80 | (c & 0x3F))); }
        else { out.push_back(static_cast<char>(0xE0 | (c >> 12))); out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F))); out.push_back(static_cast<char>(0x80 | (c & 0x3F))); }
    }
    return out;
}
std::string Narrow(const TCHAR* s) { return Narrow(std::u16string(s ? s : u"")); }
std::u16string Wide(const std::string& s) {
    std::u16string out;
    for (unsigned char c : s) out.push_back(static_cast<char16_t>(c));
    return out;
}

// exit statuses of children reaped by IsProcRunning, for GetProcReturnCode
std::map<int, int>& ExitCodes() {
    static std::map<int, int> codes;
    return codes;
}

}  // namespace

std::u16string StubFormat(const char16_t* fmt, const std::vector<FStubFormatArg>& args) {
    std::u16string out;
    size_t next = 0;
    for (const char16_t* p = fmt; p && *p; ++p) {
        if (*p != u'%') { out.push_back(*p); continue; }
        ++p;
        if (*p == u'%') { out.push_back(u'%'); continue; }
        std::string spec = "%";
        while (*p && std::string("-+ #0123456789.").find(static_cast<char>(*p)) != std::string::npos) spec.push_back(static_cast<char>(*p++));
        while (*p == u'l' || *p == u'h' || *p == u'z' || *p == u'j') ++p;
        const char conv = static_cast<char>(*p);
        if (!*p) break;
        if (next >= args.size()) { out += u"<missing>"; continue; }
        const FStubFormatArg& a = args[next++];
        char buf[128];
        if (conv == 's') { out += a.s; continue; }
        if (conv == 'f' || conv == 'g' || conv == 'e') {
            double v = a.kind == 'f' ? a.f : a.kind == 'i' ? static_cast<double>(a.i) : static_cast<double>(a.u);
            std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v);
        } else if (conv == 'u' || conv == 'x' || conv == 'X') {
            unsigned long long v = a.kind == 'u' ? a.u : static_cast<unsigned long long>(a.i);
            std::snprintf(buf, sizeof buf, (spec + "ll" + conv).c_str(), v);
        } else {
            long long v = a.kind == 'i' ? a.i : static_cast<long long>(a.u);
            std::snprintf(buf, sizeof buf, (spec + "lld").c_str(), v);
        }
        out += Wide(buf);
    }
    return out;
}

void StubLog(const FString& Line) {
    if (std::getenv("IGI_UE_LOG") != nullptr) std::fprintf(stderr, "[ue] %s\n", Narrow(Line.StubText()).c_str());
}

// ---- processes --------------------------------------------------------------------------------

FProcHandle FPlatformProcess::CreateProc(const TCHAR* URL, const TCHAR* Parms, bool, bool, bool, uint32* OutProcessID, int32,
                                         const TCHAR*, void*, void*) {
    // the engine splits Parms as a command line: spaces separate, double quotes group
    std::vector<std::string> args = {Narrow(URL)};
    std::string params = Narrow(Parms), cur;
    bool quoted = false, any = false;
    for (char c : params) {
        if (c == '"') { quoted = !quoted; any = true; continue; }
        if (c == ' ' && !quoted) { if (any) args.push_back(cur); cur.clear(); any = false; continue; }
        cur.push_back(c);
        any = true;
    }
    if (any) args.push_back(cur);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // the child's stdout/stderr go to a log next to the project's Saved folder (IGI_UE_SIDECAR_LOG)
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const char* log = std::getenv("IGI_UE_SIDECAR_LOG");
    if (log != nullptr) {
        posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        posix_spawn_file_actions_adddup2(&actions, 1, 2);
    }
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    FProcHandle h;
    if (rc != 0) return h;
    h.Pid = pid;
    if (OutProcessID) *OutProcessID = static_cast<uint32>(pid);
    return h;
}

bool FPlatformProcess::IsProcRunning(FProcHandle& ProcessHandle) {
    if (ProcessHandle.Pid <= 0) return false;
    if (ExitCodes().count(ProcessHandle.Pid)) return false;
    int status = 0;
    const pid_t r = ::waitpid(ProcessHandle.Pid, &status, WNOHANG);
    if (r == 0) return true;
    ExitCodes()[ProcessHandle.Pid] = r == ProcessHandle.Pid && WIFEXITED(status) ? WEXITSTATUS(status)
        : (r == ProcessHandle.Pid && WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1);
    return false;
}

bool FPlatformProcess::GetProcReturnCode(FProcHandle& ProcHandle, int32* ReturnCode) {
    auto it = ExitCodes().find(ProcHandle.Pid);
    if (it == ExitCodes().end()) return false;
    if (ReturnCode) *ReturnCode = it->second;
    return true;
}

void FPlatformProcess::TerminateProc(FProcHandle& ProcessHandle, bool) {
    if (ProcessHandle.Pid > 0) ::kill(ProcessHandle.Pid, SIGKILL);
}

void FPlatformProcess::CloseProc(FProcHandle& ProcessHandle) { ProcessHandle.Pid = 0; }

uint32 FPlatformProcess::GetCurrentProcessId() { return static_cast<uint32>(::getpid()); }

void FPlatformMisc::SetEnvironmentVar(const TCHAR* Name, const TCHAR* Value) {
    const std::string v = Narrow(Value);
    if (v.empty()) ::unsetenv(Narrow(Name).c_str());
    else ::setenv(Narrow(Name).c_str(), v.c_str(), 1);
}

FString FPlatformMisc::GetEnvironmentVariable(const TCHAR* Name) {
    const char* v = std::getenv(Narrow(Name).c_str());
    return FString(Wide(v ? v : ""));
}

double FPlatformTime::Seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const TCHAR* FApp::GetProjectName() { return TEXT("IgiStubGame"); }
double FApp::GetDeltaTime() { return 1.0 / 60.0; }

// ---- paths and files --------------------------------------------------------------------------

FString FPaths::ProjectDir() { return GStubProjectDir; }
FString FPaths::ProjectSavedDir() { return Combine(GStubProjectDir, TEXT("Saved/")); }

FString FPaths::GetPath(const FString& InPath) {
    const std::u16string& s = InPath.StubText();
    const size_t slash = s.find_last_of(u'/');
    return slash == std::u16string::npos ? FString() : FString(s.substr(0, slash));
}

bool FPaths::FileExists(const FString& InPath) {
    struct stat st;
    return ::stat(Narrow(InPath.StubText()).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool FPaths::IsRelative(const FString& InPath) { return !InPath.StartsWith(TEXT("/")); }

FString FPaths::ConvertRelativePathToFull(const FString& InPath) {
    if (!IsRelative(InPath)) return InPath;
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) == nullptr) return InPath;
    return Combine(FString(Wide(cwd)), InPath);
}

bool FFileHelper::LoadFileToString(FString& Result, const TCHAR* Filename) {
    std::ifstream in(Narrow(Filename), std::ios::binary);
    if (!in) return false;
    std::stringstream ss;
    ss << in.rdbuf();
    Result = FString(Wide(ss.str()));
    return true;
}

bool FFileHelper::SaveStringToFile(const FString& String, const TCHAR* Filename) {
    std::ofstream out(Narrow(Filename), std::ios::binary | std::ios::trunc);
    out << Narrow(String.StubText());
    return static_cast<bool>(out);
}

IFileManager& IFileManager::Get() {
    static IFileManager m;
    return m;
}

bool IFileManager::MakeDirectory(const TCHAR* Path, bool Tree) {
    const std::string p = Narrow(Path);
    if (Tree) {
        for (size_t i = 1; i < p.size(); ++i) {
            if (p[i] == '/') ::mkdir(p.substr(0, i).c_str(), 0700);
        }
    }
    return ::mkdir(p.c_str(), 0700) == 0 || errno == EEXIST;
}

bool IFileManager::Delete(const TCHAR* Filename, bool, bool, bool) { return ::unlink(Narrow(Filename).c_str()) == 0; }

int64 IFileManager::FileSize(const TCHAR* Filename) {
    struct stat st;
    if (::stat(Narrow(Filename).c_str(), &st) != 0) return -1;
    return static_cast<int64>(st.st_size);
}

FGuid FGuid::NewGuid() {
    static std::mt19937_64 rng{std::random_device{}()};
    FGuid g;
    g.A = rng();
    g.B = rng();
    return g;
}

FString FGuid::ToString(EGuidFormats) const {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%016llX%016llX", static_cast<unsigned long long>(A), static_cast<unsigned long long>(B));
    return FString(Wide(buf));
}

FTimespan FTimespan::FromMilliseconds(double) { return FTimespan(); }
