// igi::ISocket over Unreal's FSocket, so the core uses the engine's socket layer (and its
// platform abstractions) instead of BSD sockets.
#pragma once

#include <atomic>

#include "CoreMinimal.h"
#include "IgiSocket.h"

class FSocket;

class FIgiUnrealSocket final : public igi::ISocket
{
public:
	~FIgiUnrealSocket() override;
	bool Connect(const std::string& Host, uint16_t Port, int TimeoutMs, std::string& Error) override;
	bool SendAll(const uint8_t* Data, size_t Count, int TimeoutMs) override;
	int Recv(uint8_t* Buffer, size_t Capacity, int TimeoutMs) override;
	// FSocket has no way to interrupt a Wait: Recv waits in short slices and checks this flag
	void Wake() override { bWake.store(true); }
	void Close() override;

private:
	FSocket* Socket = nullptr;
	std::atomic<bool> bWake{false};
};
