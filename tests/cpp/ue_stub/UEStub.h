// A minimal stand-in for the Unreal Engine declarations the plugin's Unreal layer uses, so that
// layer can be type-checked (-fsyntax-only) where no engine is installed, and linked and run
// (tests/cpp/test_unreal_layer.cpp) with UEStubRuntime.cpp. Signatures follow UE 5.3. What the
// layer's logic depends on behaves as the engine's does, on POSIX: strings and Printf, arrays
// and maps, shared and weak pointers (a weak pointer to a destroyed UObject reads null), dynamic
// multicast delegates, the core ticker (ticked by the test), processes, files, paths, GUIDs, the
// game instance's subsystems and the world. The sockets part has declarations only (the layer's
// tests use the core's BSD sockets). Reflection macros expand to nothing. TCHAR is char16_t, as
// on Windows (wchar_t there), so narrow strings passed where FString/TCHAR is expected fail to
// compile.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// ---- reflection macros ----------------------------------------------------------------------
#define UCLASS(...)
#define USTRUCT(...)
#define UENUM(...)
#define UPROPERTY(...)
#define UFUNCTION(...)
#define UPARAM(...)
#define UMETA(...)
#define GENERATED_BODY()
#define IGISDK_API
#define PLATFORM_WINDOWS 0
#define PLATFORM_SOCKETSUBSYSTEM FName()

// ---- basic types ----------------------------------------------------------------------------
typedef char16_t TCHAR;
typedef uint8_t uint8;
typedef uint16_t uint16;
typedef uint32_t uint32;
typedef uint64_t uint64;
typedef int8_t int8;
typedef int16_t int16;
typedef int32_t int32;
typedef int64_t int64;
#define TEXT(x) u##x

template <typename T>
inline typename std::remove_reference<T>::type&& MoveTemp(T&& v) {
    static_assert(!std::is_const<typename std::remove_reference<T>::type>::value, "MoveTemp of a const");
    return static_cast<typename std::remove_reference<T>::type&&>(v);
}

template <typename T>
using TFunction = std::function<T>;

struct FMath {
    template <typename T> static T Min(T a, T b) { return a < b ? a : b; }
    template <typename T> static T Max(T a, T b) { return a < b ? b : a; }
    template <typename T> static T Clamp(T v, T lo, T hi) { return v < lo ? lo : (hi < v ? hi : v); }
};

struct FStubFormatArg {
    char kind = 'i';  // 's' string, 'i' signed, 'u' unsigned, 'f' floating
    std::u16string s;
    long long i = 0;
    unsigned long long u = 0;
    double f = 0;
};
inline FStubFormatArg StubFormatArg(const char16_t* v) { FStubFormatArg a; a.kind = 's'; a.s = v ? v : u"(null)"; return a; }
template <typename T>
inline typename std::enable_if<std::is_integral<T>::value || std::is_enum<T>::value, FStubFormatArg>::type StubFormatArg(T v) {
    FStubFormatArg a;
    if (std::is_signed<T>::value) { a.kind = 'i'; a.i = static_cast<long long>(v); }
    else { a.kind = 'u'; a.u = static_cast<unsigned long long>(v); }
    return a;
}
inline FStubFormatArg StubFormatArg(double v) { FStubFormatArg a; a.kind = 'f'; a.f = v; return a; }
inline FStubFormatArg StubFormatArg(float v) { return StubFormatArg(static_cast<double>(v)); }
std::u16string StubFormat(const char16_t* fmt, const std::vector<FStubFormatArg>& args);  // UEStubRuntime.cpp

class FString {
public:
    FString() = default;
    FString(const TCHAR* s) : s_(s ? s : u"") {}
    explicit FString(std::u16string s) : s_(std::move(s)) {}
    const std::u16string& StubText() const { return s_; }
    const TCHAR* operator*() const { return s_.c_str(); }
    int32 Len() const { return static_cast<int32>(s_.size()); }
    bool IsEmpty() const { return s_.empty(); }
    void Empty() { s_.clear(); }
    TCHAR& operator[](int32 i) { return s_[i]; }
    const TCHAR& operator[](int32 i) const { return s_[i]; }
    FString operator+(const FString& o) const { FString r(*this); r.s_ += o.s_; return r; }
    FString operator+(const TCHAR* o) const { FString r(*this); r.s_ += o; return r; }
    friend FString operator+(const TCHAR* a, const FString& b) { return FString(a) + b; }
    FString& operator+=(const FString& o) { s_ += o.s_; return *this; }
    FString& operator+=(const TCHAR* o) { s_ += o; return *this; }
    bool operator==(const FString& o) const { return s_ == o.s_; }
    bool operator==(const TCHAR* o) const { return s_ == o; }
    bool operator!=(const FString& o) const { return s_ != o.s_; }
    bool operator<(const FString& o) const { return s_ < o.s_; }
    bool StartsWith(const TCHAR* p) const { return s_.rfind(p, 0) == 0; }
    bool EndsWith(const TCHAR* p) const { std::u16string q(p); return s_.size() >= q.size() && s_.compare(s_.size() - q.size(), q.size(), q) == 0; }
    bool Contains(const TCHAR* p) const { return s_.find(p) != std::u16string::npos; }
    void TrimStartAndEndInline() {
        auto space = [](char16_t c) { return c == u' ' || c == u'\t' || c == u'\r' || c == u'\n'; };
        while (!s_.empty() && space(s_.back())) s_.pop_back();
        size_t b = 0;
        while (b < s_.size() && space(s_[b])) ++b;
        s_.erase(0, b);
    }
    FString Left(int32 n) const { FString r; r.s_ = s_.substr(0, n < 0 ? 0 : static_cast<size_t>(n)); return r; }
    template <typename... A> static FString Printf(const TCHAR* fmt, A&&... a) {
        return FString(StubFormat(fmt, std::vector<FStubFormatArg>{StubFormatArg(a)...}));
    }

private:
    std::u16string s_;
};

// UTF8_TO_TCHAR / TCHAR_TO_UTF8: conversion objects that live until the end of the expression
struct FUtf8ToTchar {
    explicit FUtf8ToTchar(const char* s) { while (s && *s) out.push_back(static_cast<char16_t>(*s++)); }
    const TCHAR* Get() const { return out.c_str(); }
    std::u16string out;
};
struct FTcharToUtf8 {
    explicit FTcharToUtf8(const TCHAR* s) { while (s && *s) out.push_back(static_cast<char>(*s++)); }
    const char* Get() const { return out.c_str(); }
    std::string out;
};
#define UTF8_TO_TCHAR(s) (FUtf8ToTchar(s).Get())
#define TCHAR_TO_UTF8(s) (FTcharToUtf8(s).Get())

class FName {
public:
    FName() = default;
    FName(const TCHAR*) {}
};
extern const FName NAME_Stream;

template <typename T>
class TArray {
public:
    int32 Add(const T& v) { v_.push_back(v); return Num() - 1; }
    int32 Add(T&& v) { v_.push_back(std::move(v)); return Num() - 1; }
    int32 Num() const { return static_cast<int32>(v_.size()); }
    bool IsEmpty() const { return v_.empty(); }
    void Empty() { v_.clear(); }
    T* GetData() { return v_.data(); }
    const T* GetData() const { return v_.data(); }
    bool Contains(const T& v) const { for (const T& x : v_) if (x == v) return true; return false; }
    int32 Remove(const T& v) {
        int32 n = 0;
        for (size_t i = v_.size(); i-- > 0;) if (v_[i] == v) { v_.erase(v_.begin() + static_cast<long>(i)); ++n; }
        return n;
    }
    void RemoveAt(int32 i) { v_.erase(v_.begin() + i); }
    T& operator[](int32 i) { return v_[i]; }
    const T& operator[](int32 i) const { return v_[i]; }
    T* begin() { return v_.data(); }
    T* end() { return v_.data() + v_.size(); }
    const T* begin() const { return v_.data(); }
    const T* end() const { return v_.data() + v_.size(); }

private:
    std::vector<T> v_;
};

template <typename K, typename V>
class TMap {
public:
    V& Add(const K& k, V v) { return m_[k] = std::move(v); }
    V* Find(const K& k) { auto it = m_.find(k); return it == m_.end() ? nullptr : &it->second; }
    const V* Find(const K& k) const { auto it = m_.find(k); return it == m_.end() ? nullptr : &it->second; }
    int32 Remove(const K& k) { return static_cast<int32>(m_.erase(k)); }
    bool Contains(const K& k) const { return m_.count(k) != 0; }
    void Empty() { m_.clear(); }
    int32 Num() const { return static_cast<int32>(m_.size()); }
    int32 GenerateKeyArray(TArray<K>& out) const { out.Empty(); for (const auto& kv : m_) out.Add(kv.first); return out.Num(); }

private:
    std::map<K, V> m_;
};

template <typename T>
class TSharedPtr {
public:
    TSharedPtr() = default;
    TSharedPtr(std::shared_ptr<T> p) : p_(std::move(p)) {}
    T* operator->() const { return p_.get(); }
    T& operator*() const { return *p_; }
    bool IsValid() const { return p_ != nullptr; }
    explicit operator bool() const { return IsValid(); }

private:
    std::shared_ptr<T> p_;
};

template <typename T>
class TSharedRef {
public:
    explicit TSharedRef(std::shared_ptr<T> p) : p_(std::move(p)) {}
    T* operator->() const { return p_.get(); }
    T& operator*() const { return *p_; }
    T& Get() const { return *p_; }
    operator TSharedPtr<T>() const { return TSharedPtr<T>(p_); }

private:
    std::shared_ptr<T> p_;
};

template <typename T, typename... A>
TSharedRef<T> MakeShared(A&&... a) { return TSharedRef<T>(std::make_shared<T>(std::forward<A>(a)...)); }

// ---- logging --------------------------------------------------------------------------------
struct FLogCategoryStub {};
#define DEFINE_LOG_CATEGORY_STATIC(Name, Verbosity, Compile) static FLogCategoryStub Name;
void StubLog(const FString& Line);  // UEStubRuntime.cpp: stderr when IGI_UE_LOG is set
template <typename... A> inline void UeLogStub(const FLogCategoryStub&, const TCHAR* Format, A&&... a) {
    StubLog(FString::Printf(Format, std::forward<A>(a)...));
}
#define UE_LOG(Category, Verbosity, Format, ...) UeLogStub(Category, Format, ##__VA_ARGS__)

// ---- UObject --------------------------------------------------------------------------------
class UWorld;
class UGameInstance;

// every live UObject and its serial number: a weak pointer to one that was deleted reads null,
// as after GC in UE, even when a new object takes its address (UE's weak pointers keep a serial
// number for the same reason)
std::map<const void*, uint64>& StubLiveObjects();  // UEStubRuntime.cpp
uint64 StubNextSerial();
inline uint64 StubSerialOf(const void* p) { auto it = StubLiveObjects().find(p); return it == StubLiveObjects().end() ? 0 : it->second; }

class UObject {
public:
    UObject() { StubLiveObjects()[this] = StubNextSerial(); }
    UObject(const UObject&) = delete;
    UObject& operator=(const UObject&) = delete;
    virtual ~UObject() { StubLiveObjects().erase(this); }
    virtual UWorld* GetWorld() const { return nullptr; }
};

template <typename T>
T* NewObject(UObject* Outer = nullptr) { (void)Outer; return new T(); }

template <typename T>
class TWeakObjectPtr {
public:
    TWeakObjectPtr() = default;
    TWeakObjectPtr(T* p) : p_(p), serial_(StubSerialOf(static_cast<const void*>(static_cast<const UObject*>(p)))) {}
    T* Get() const { return p_ != nullptr && serial_ != 0 && StubSerialOf(static_cast<const void*>(static_cast<const UObject*>(p_))) == serial_ ? p_ : nullptr; }
    bool IsValid() const { return Get() != nullptr; }

private:
    T* p_ = nullptr;
    uint64 serial_ = 0;
};

// Dynamic multicast delegates: Broadcast with the declared parameters; AddDynamic/RemoveDynamic
// take a UObject and one of its member functions of the right signature.
template <typename... A>
class TDynamicMulticastStub {
public:
    // calls every bound function whose object is alive, in the order bound; a handler may bind
    // or unbind (the list is copied first)
    void Broadcast(A... args) const {
        std::vector<Binding> now = bound_;
        for (const Binding& b : now) {
            if (StubSerialOf(b.object) == b.serial && IsBound(b.object, b.key)) b.call(args...);
        }
    }
    template <typename U> void AddDynamicImpl(U* o, void (U::*f)(A...)) {
        if (IsBound(static_cast<const void*>(static_cast<const UObject*>(o)), Key(f))) return;
        const void* object = static_cast<const void*>(static_cast<const UObject*>(o));
        bound_.push_back(Binding{object, StubSerialOf(object), Key(f), [o, f](A... a) { (o->*f)(a...); }});
    }
    template <typename U> void RemoveDynamicImpl(U* o, void (U::*f)(A...)) {
        const std::string k = Key(f);
        for (size_t i = 0; i < bound_.size(); ++i) {
            if (bound_[i].object == static_cast<const void*>(static_cast<const UObject*>(o)) && bound_[i].key == k) { bound_.erase(bound_.begin() + static_cast<long>(i)); return; }
        }
    }
    int32 StubNumBound() const { return static_cast<int32>(bound_.size()); }
    void Clear() { bound_.clear(); }

private:
    struct Binding {
        const void* object;
        uint64 serial;
        std::string key;
        std::function<void(A...)> call;
    };
    template <typename F> static std::string Key(F f) { return std::string(reinterpret_cast<const char*>(&f), sizeof f); }
    bool IsBound(const void* o, const std::string& k) const {
        for (const Binding& b : bound_) if (b.object == o && b.key == k) return true;
        return false;
    }
    std::vector<Binding> bound_;
};
#define AddDynamic(Object, Function) AddDynamicImpl(Object, Function)
#define RemoveDynamic(Object, Function) RemoveDynamicImpl(Object, Function)
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE(Name) class Name : public TDynamicMulticastStub<> {};
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(Name, T1, P1) class Name : public TDynamicMulticastStub<T1> {};
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(Name, T1, P1, T2, P2) class Name : public TDynamicMulticastStub<T1, T2> {};

// ---- engine classes -------------------------------------------------------------------------
class FSubsystemCollectionBase {};

class USubsystem : public UObject {
public:
    virtual void Initialize(FSubsystemCollectionBase&) {}
    virtual void Deinitialize() {}
};

// GENERATED_BODY() declares Super in real builds; here each base names itself, which a
// derived class inherits as its Super
class UGameInstanceSubsystem : public USubsystem {
public:
    typedef UGameInstanceSubsystem Super;
    UGameInstance* GetGameInstance() const { return StubGameInstance; }
    UGameInstance* StubGameInstance = nullptr;  // the outer: set by UGameInstance::StubAddSubsystem
};

// true: the process runs as a dedicated server (tests set it)
extern bool GStubIsDedicatedServer;
inline bool IsRunningDedicatedServer() { return GStubIsDedicatedServer; }

template <typename T> const void* StubTypeKey() { static const char key = 0; return &key; }

class UGameInstance : public UObject {
public:
    ~UGameInstance() override { for (auto& kv : subsystems_) delete kv.second; }
    // no RTTI: subsystems are found by a per-type key
    template <typename T> T* GetSubsystem() const {
        auto it = subsystems_.find(StubTypeKey<T>());
        return it == subsystems_.end() ? nullptr : static_cast<T*>(it->second);
    }
    bool IsDedicatedServerInstance() const { return bStubDedicatedServerInstance; }
    // creates the subsystem as the engine does before Initialize (the test then sets its config)
    template <typename T> T* StubAddSubsystem() {
        T* s = new T();
        s->StubGameInstance = this;
        subsystems_[StubTypeKey<T>()] = s;
        return s;
    }
    bool bStubDedicatedServerInstance = false;

private:
    std::map<const void*, USubsystem*> subsystems_;
};

class UWorld : public UObject {
public:
    UGameInstance* GetGameInstance() const { return StubGameInstance; }
    UGameInstance* StubGameInstance = nullptr;
};

enum class EGetWorldErrorMode { ReturnNull, LogAndReturnNull, Assert };
class UEngine {
public:
    UWorld* GetWorldFromContextObject(const UObject* o, EGetWorldErrorMode) const { return o ? o->GetWorld() : nullptr; }
};
extern UEngine* GEngine;

namespace EEndPlayReason { enum Type { Destroyed, LevelTransition, EndPlayInEditor, RemovedFromWorld, Quit }; }

class UActorComponent : public UObject {
public:
    typedef UActorComponent Super;
    virtual void BeginPlay() {}
    virtual void EndPlay(const EEndPlayReason::Type) {}
    UWorld* GetWorld() const override { return StubWorld; }
    UWorld* StubWorld = nullptr;  // the world of its actor
};

class UBlueprintAsyncActionBase : public UObject {
public:
    typedef UBlueprintAsyncActionBase Super;
    virtual void Activate() {}
    virtual void SetReadyToDestroy() {}
    virtual void RegisterWithGameInstance(const UObject*) {}
};

class USaveGame : public UObject {};

// ---- ticker ---------------------------------------------------------------------------------
class FTickerDelegate {
public:
    template <typename U> static FTickerDelegate CreateUObject(U* o, bool (U::*f)(float)) {
        FTickerDelegate d;
        d.call = [o, f](float dt) { return (o->*f)(dt); };
        return d;
    }
    template <typename F> static FTickerDelegate CreateLambda(F f) { FTickerDelegate d; d.call = std::move(f); return d; }
    std::function<bool(float)> call;
};
// The core ticker: the test's loop calls Tick once per frame, as the engine's main loop does.
class FTSTicker {
public:
    struct FDelegateHandle { uint64 id = 0; };
    static FTSTicker& GetCoreTicker() { static FTSTicker t; return t; }
    FDelegateHandle AddTicker(const FTickerDelegate& d, float) { FDelegateHandle h; h.id = ++next_; tickers_[h.id] = d.call; return h; }
    void RemoveTicker(FDelegateHandle h) { tickers_.erase(h.id); }
    void Tick(float dt) {
        std::vector<uint64> ids;
        for (const auto& kv : tickers_) ids.push_back(kv.first);
        for (uint64 id : ids) {
            auto it = tickers_.find(id);
            if (it == tickers_.end()) continue;  // removed by an earlier one this frame
            std::function<bool(float)> f = it->second;
            if (!f(dt)) tickers_.erase(id);
        }
    }
    int32 StubNumTickers() const { return static_cast<int32>(tickers_.size()); }

private:
    uint64 next_ = 0;
    std::map<uint64, std::function<bool(float)>> tickers_;
};

// ---- platform -------------------------------------------------------------------------------
struct FProcHandle {
    bool IsValid() const { return Pid > 0; }
    int Pid = 0;
};
struct FPlatformProcess {
    static FProcHandle CreateProc(const TCHAR* URL, const TCHAR* Parms, bool bLaunchDetached, bool bLaunchHidden,
                                  bool bLaunchReallyHidden, uint32* OutProcessID, int32 PriorityModifier,
                                  const TCHAR* OptionalWorkingDirectory, void* PipeWriteChild, void* PipeReadChild = nullptr);
    static bool IsProcRunning(FProcHandle& ProcessHandle);
    static bool GetProcReturnCode(FProcHandle& ProcHandle, int32* ReturnCode);
    static void TerminateProc(FProcHandle& ProcessHandle, bool KillTree = false);
    static void CloseProc(FProcHandle& ProcessHandle);
    static uint32 GetCurrentProcessId();
};
struct FPlatformMisc {
    static void SetEnvironmentVar(const TCHAR* Name, const TCHAR* Value);
    static FString GetEnvironmentVariable(const TCHAR* Name);
};
struct FPlatformTime {
    static double Seconds();
};
struct FApp {
    static const TCHAR* GetProjectName();
    static double GetDeltaTime();
};
struct FPaths {
    static FString ProjectDir();
    static FString ProjectSavedDir();
    static FString GetPath(const FString& InPath);
    static bool FileExists(const FString& InPath);
    static bool IsRelative(const FString& InPath);
    static FString ConvertRelativePathToFull(const FString& InPath);
    template <typename... A> static FString Combine(const A&... parts) {
        FString out;
        for (const FString& p : {FString(parts)...}) {
            if (p.IsEmpty()) continue;
            if (!out.IsEmpty() && !out.EndsWith(TEXT("/")) && !p.StartsWith(TEXT("/"))) out += TEXT("/");
            out += p;
        }
        return out;
    }
};
extern FString GStubProjectDir;  // FPaths::ProjectDir(), ending in '/'; tests set it
struct FFileHelper {
    static bool LoadFileToString(FString& Result, const TCHAR* Filename);
    static bool SaveStringToFile(const FString& String, const TCHAR* Filename);
};
class IFileManager {
public:
    static IFileManager& Get();
    bool MakeDirectory(const TCHAR* Path, bool Tree = false);
    bool Delete(const TCHAR* Filename, bool RequireExists = false, bool EvenReadOnly = false, bool Quiet = false);
    int64 FileSize(const TCHAR* Filename);  // -1 when there is no such file
};
enum class EGuidFormats { Digits, DigitsWithHyphens };
struct FGuid {
    static FGuid NewGuid();
    FString ToString(EGuidFormats Format) const;
    uint64 A = 0, B = 0;
};
struct FTimespan {
    static FTimespan FromMilliseconds(double Milliseconds);
    double GetTotalMilliseconds() const { return Ms; }
    double Ms = 0;
};

// ---- modules --------------------------------------------------------------------------------
class IModuleInterface {
public:
    virtual ~IModuleInterface() = default;
    virtual void StartupModule() {}
    virtual void ShutdownModule() {}
};
class FDefaultModuleImpl : public IModuleInterface {};
#define IMPLEMENT_MODULE(Class, Name) static Class Name##ModuleInstance;

// ---- sockets --------------------------------------------------------------------------------
namespace ESocketWaitConditions { enum Type { WaitForRead, WaitForWrite, WaitForReadOrWrite }; }
enum ESocketConnectionState { SCS_NotConnected, SCS_Connected, SCS_ConnectionError };
enum class ESocketShutdownMode { Read, Write, ReadWrite };
namespace ESocketReceiveFlags { enum Type { None = 0, Peek = 2, WaitAll = 0x100 }; }

class FInternetAddr {
public:
    virtual ~FInternetAddr() = default;
    virtual void SetIp(const TCHAR* InAddr, bool& bIsValid) = 0;
    virtual void SetPort(int32 InPort) = 0;
    virtual FName GetProtocolType() const = 0;
};

class FSocket {
public:
    virtual ~FSocket() = default;
    virtual bool Shutdown(ESocketShutdownMode Mode) = 0;
    virtual bool Close() = 0;
    virtual bool Connect(const FInternetAddr& Addr) = 0;
    virtual bool Send(const uint8* Data, int32 Count, int32& BytesSent) = 0;
    virtual bool Recv(uint8* Data, int32 BufferSize, int32& BytesRead, ESocketReceiveFlags::Type Flags = ESocketReceiveFlags::None) = 0;
    virtual bool Wait(ESocketWaitConditions::Type Condition, FTimespan WaitTime) = 0;
    virtual ESocketConnectionState GetConnectionState() = 0;
    virtual bool SetNonBlocking(bool bIsNonBlocking = true) = 0;
    virtual bool SetNoDelay(bool bIsNoDelay = true) = 0;
};

class ISocketSubsystem {
public:
    static ISocketSubsystem* Get(const FName& SubsystemName = FName());
    virtual ~ISocketSubsystem() = default;
    virtual FSocket* CreateSocket(const FName& SocketType, const FString& SocketDescription, const FName& ProtocolName) = 0;
    virtual void DestroySocket(FSocket* Socket) = 0;
    virtual TSharedRef<FInternetAddr> CreateInternetAddr() = 0;
};
