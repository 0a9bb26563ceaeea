// A minimal stand-in for the Unreal Engine declarations the plugin's Unreal layer uses, so that
// layer can be type-checked (-fsyntax-only) where no engine is installed. Signatures follow UE
// 5.3; bodies are empty. Reflection macros expand to nothing. TCHAR is char16_t, as on Windows
// (wchar_t there), so narrow strings passed where FString/TCHAR is expected fail to compile.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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

class FString {
public:
    FString() = default;
    FString(const TCHAR* s) : s_(s ? s : u"") {}
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
    void TrimStartAndEndInline() {}
    FString Left(int32 n) const { FString r; r.s_ = s_.substr(0, static_cast<size_t>(n)); return r; }
    template <typename... A> static FString Printf(const TCHAR* fmt, A&&...) { return FString(fmt); }

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
    void Empty() { v_.clear(); }
    T& operator[](int32 i) { return v_[i]; }
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
template <typename... A> inline void UeLogStub(const FLogCategoryStub&, const TCHAR*, A&&...) {}
#define UE_LOG(Category, Verbosity, Format, ...) UeLogStub(Category, Format, ##__VA_ARGS__)

// ---- UObject --------------------------------------------------------------------------------
class UWorld;
class UGameInstance;

class UObject {
public:
    virtual ~UObject() = default;
    virtual UWorld* GetWorld() const { return nullptr; }
};

template <typename T>
T* NewObject(UObject* Outer = nullptr) { (void)Outer; return new T(); }

template <typename T>
class TWeakObjectPtr {
public:
    TWeakObjectPtr() = default;
    TWeakObjectPtr(T* p) : p_(p) {}
    T* Get() const { return p_; }
    bool IsValid() const { return p_ != nullptr; }

private:
    T* p_ = nullptr;
};

// Dynamic multicast delegates: Broadcast with the declared parameters; AddDynamic/RemoveDynamic
// take a UObject and one of its member functions of the right signature.
template <typename... A>
class TDynamicMulticastStub {
public:
    void Broadcast(A... args) const { (void)sizeof...(args); }
    template <typename U> void AddDynamicImpl(U*, void (U::*)(A...)) {}
    template <typename U> void RemoveDynamicImpl(U*, void (U::*)(A...)) {}
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
    UGameInstance* GetGameInstance() const { return nullptr; }
};

class UGameInstance : public UObject {
public:
    template <typename T> T* GetSubsystem() const { return nullptr; }
};

class UWorld : public UObject {
public:
    UGameInstance* GetGameInstance() const { return nullptr; }
};

enum class EGetWorldErrorMode { ReturnNull, LogAndReturnNull, Assert };
class UEngine {
public:
    UWorld* GetWorldFromContextObject(const UObject*, EGetWorldErrorMode) const { return nullptr; }
};
extern UEngine* GEngine;

namespace EEndPlayReason { enum Type { Destroyed, LevelTransition, EndPlayInEditor, RemovedFromWorld, Quit }; }

class UActorComponent : public UObject {
public:
    typedef UActorComponent Super;
    virtual void BeginPlay() {}
    virtual void EndPlay(const EEndPlayReason::Type) {}
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
    template <typename U> static FTickerDelegate CreateUObject(U*, bool (U::*)(float)) { return FTickerDelegate(); }
};
class FTSTicker {
public:
    struct FDelegateHandle {};
    static FTSTicker& GetCoreTicker() { static FTSTicker t; return t; }
    FDelegateHandle AddTicker(const FTickerDelegate&, float) { return FDelegateHandle(); }
    void RemoveTicker(FDelegateHandle) {}
};

// ---- platform -------------------------------------------------------------------------------
struct FProcHandle {
    bool IsValid() const { return false; }
};
struct FPlatformProcess {
    static FProcHandle CreateProc(const TCHAR* URL, const TCHAR* Parms, bool bLaunchDetached, bool bLaunchHidden,
                                  bool bLaunchReallyHidden, uint32* OutProcessID, int32 PriorityModifier,
                                  const TCHAR* OptionalWorkingDirectory, void* PipeWriteChild, void* PipeReadChild = nullptr);
    static bool IsProcRunning(FProcHandle& ProcessHandle);
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
    static FString ConvertRelativePathToFull(const FString& InPath);
    template <typename... A> static FString Combine(A&&...) { return FString(); }
};
struct FFileHelper {
    static bool LoadFileToString(FString& Result, const TCHAR* Filename);
    static bool SaveStringToFile(const FString& String, const TCHAR* Filename);
};
class IFileManager {
public:
    static IFileManager& Get();
    bool MakeDirectory(const TCHAR* Path, bool Tree = false);
    int64 FileSize(const TCHAR* Filename);  // -1 when there is no such file
};
enum class EGuidFormats { Digits, DigitsWithHyphens };
struct FGuid {
    static FGuid NewGuid();
    FString ToString(EGuidFormats Format) const;
};
struct FTimespan {
    static FTimespan FromMilliseconds(double Milliseconds);
};

// ---- modules --------------------------------------------------------------------------------
class IModuleInterface {
public:
    virtual ~IModuleInterface() = default;
};
class FDefaultModuleImpl : public IModuleInterface {};
#define IMPLEMENT_MODULE(Class, Name) static Class Name##ModuleInstance;

// ---- sockets --------------------------------------------------------------------------------
namespace ESocketWaitConditions { enum Type { WaitForRead, WaitForWrite, WaitForReadOrWrite }; }
enum ESocketConnectionState { SCS_NotConnected, SCS_Connected, SCS_ConnectionError };
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
