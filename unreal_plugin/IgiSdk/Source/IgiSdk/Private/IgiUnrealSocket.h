// igi::ISocket over Unreal's FSocket, so the core uses the engine's socket layer (and its
// platform abstractions) instead of BSD sockets.
//
// FSocket::Wait watches one socket and cannot be interrupted, so a wake-up for outgoing requests
// cannot share the wait with the connection. A reader thread of its own blocks in
// FSocket::Wait(WaitForRead) and moves what arrives into a buffer; the core's I/O thread waits on
// a condition variable that arriving bytes, a close and Wake() all signal. Both threads sleep
// until there is traffic (the reader also wakes every ReaderSliceMs to notice a close the
// platform did not signal); nothing polls in short slices.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

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
	void Wake() override;
	void Close() override;

private:
	void ReadLoop();
	void MarkClosed();

	FSocket* Socket = nullptr;
	std::thread Reader;

	std::mutex Mutex;
	std::condition_variable Arrived;  // bytes, a close or a Wake(): for Recv
	std::condition_variable Drained;  // room in Pending: for the reader
	std::vector<uint8_t> Pending;     // read by the reader thread, not yet taken by Recv
	size_t PendingAt = 0;
	bool bClosed = true;
	bool bStopping = false;
	bool bWoken = false;
};
